"""One reply's decoding loop, shared by every front end that cancels replies (the chat app, the
server): engine events in, callbacks out, stopping at the first event after a cancel."""

import threading
from collections.abc import Callable

from specchat.decoding.events import Engine, IterationEvent, SamplingParams


def run_reply(engine: Engine, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
              cancel: threading.Event, on_event: Callable[[IterationEvent], None],
              on_notice: Callable[[str], None]) -> bool:
    """Run the engine on `prompt_ids`, handing each event to `on_event`, until the reply ends or
    `cancel` is set; returns whether it ended by itself.

    A notice reaches `on_notice` before its event, even after a cancel: an engine says a notice
    once, and it outlives the reply.
    """
    events = engine.generate(prompt_ids, max_new_tokens, sampling)
    try:
        for event in events:
            if event.notice:
                on_notice(event.notice)
            if cancel.is_set():
                return False
            on_event(event)
        return True
    finally:
        # Closing the generator now, in the decoding thread, frees what the reply holds at once, and
        # the engine is idle when this returns.
        events.close()
