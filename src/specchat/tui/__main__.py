"""Dev mode: `python -m specchat.tui [--continue] [--delay S] [--dsi]` runs the app on the fake engine."""

import argparse

from specchat.tui.app import SpecchatApp
from specchat.tui.fake import FakeBackend, FakeDSIEngine, FakeEngine
from specchat.tui.store import ConversationStore


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m specchat.tui", description=__doc__)
    parser.add_argument("--continue", dest="resume", action="store_true", help="reopen the last conversation")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per fake iteration")
    parser.add_argument("--dsi", action="store_true", help="the fake dsi engine, alone as the real one runs")
    args = parser.parse_args()
    tree = [FakeEngine(delay_s=args.delay), FakeEngine(name="autoregressive", accepted=(0,), delay_s=args.delay / 3)]
    engines = [FakeDSIEngine(delay_s=args.delay)] if args.dsi else tree
    store = ConversationStore()
    conversation_id = store.last_conversation_id() if args.resume else None
    SpecchatApp(FakeBackend(engines), store, conversation_id).run()


if __name__ == "__main__":
    main()
