"""Dev mode: `python -m specchat.tui [--continue] [--delay S]` runs the app on the fake engine."""

import argparse

from specchat.tui.app import SpecchatApp
from specchat.tui.fake import FakeBackend, FakeEngine
from specchat.tui.store import ConversationStore


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m specchat.tui", description=__doc__)
    parser.add_argument("--continue", dest="resume", action="store_true", help="reopen the last conversation")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per fake iteration")
    args = parser.parse_args()
    engines = [FakeEngine(delay_s=args.delay), FakeEngine(name="autoregressive", accepted=(0,), delay_s=args.delay / 3)]
    store = ConversationStore()
    conversation_id = store.last_conversation_id() if args.resume else None
    SpecchatApp(FakeBackend(engines), store, conversation_id).run()


if __name__ == "__main__":
    main()
