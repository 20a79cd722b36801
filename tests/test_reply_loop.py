"""reply_loop.py: one reply's events handed out, a notice first, stopped at the first event after a
cancel with the engine's generator closed before the loop returns."""

import threading

from specchat.decoding.events import SamplingParams
from specchat.reply_loop import run_reply
from specchat.tui.fake import WORKER_NOTICE, FakeDSIEngine, FakeEngine


def test_run_reply_hands_every_event_and_the_notice_first():
    seen = []
    ended = run_reply(FakeDSIEngine(), [1], 20, SamplingParams(), threading.Event(),
                      on_event=lambda e: seen.append(("event", len(e.token_ids))),
                      on_notice=lambda notice: seen.append(("notice", notice)))
    assert ended is True and seen[0] == ("notice", WORKER_NOTICE) and seen[1][0] == "event"
    assert sum(n for kind, n in seen if kind == "event") == 20


class KeptEvents(FakeEngine):
    """An engine that keeps its reply's generator, as one that holds its last reply does: dropping
    the loop's reference then does not close it, only the loop's own close does."""

    def __init__(self):
        super().__init__()
        self.closed = False
        self.kept = None

    def generate(self, *args):
        self.kept = self.events(*args)
        return self.kept

    def events(self, *args):
        try:
            yield from super().generate(*args)
        finally:
            self.closed = True


def test_run_reply_stops_at_the_first_event_after_cancel_and_closes_the_engines_generator():
    cancel, seen = threading.Event(), []

    def on_event(event):
        seen.append(event)
        cancel.set()

    engine = KeptEvents()
    assert run_reply(engine, [1], 100, SamplingParams(), cancel, on_event, on_notice=seen.append) is False
    assert len(seen) == 1 and engine.closed

