"""The decoding loop that runs in a worker thread: engine events in, app messages out."""

import threading
from collections.abc import Callable

from textual.message import Message

from specchat.tui.messages import EngineNotice, IterationArrived, ReplyFinished
from specchat.tui.reply import ReplyJob


def decode_reply(job: ReplyJob, engine_lock: threading.Lock, post: Callable[[Message], object]) -> None:
    """Run `job`, posting one message per iteration; stop at the first event after `cancel`.

    The lock keeps a cancelled reply's last iteration from overlapping the next reply's first:
    the app releases the prompt at once, and the engine finishes its iteration in the background.
    """
    with engine_lock:
        if job.cancel.is_set():
            return
        run_events(job, post)
    # A cancelled reply was already closed by the app, which ignores anything it posts later.
    if not job.cancel.is_set():
        post(ReplyFinished(job.id, job.stream.finish()))


def run_events(job: ReplyJob, post: Callable[[Message], object]) -> None:
    events = job.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling)
    try:
        for event in events:
            # Posted even after a cancel: an engine says a notice once, and it outlives the reply.
            if event.notice:
                post(EngineNotice(event.notice))
            if job.cancel.is_set():
                return
            post(IterationArrived(job.id, event, job.stream.push(event.token_ids)))
    finally:
        # Closing the generator now, in this thread, releases the engine's caches at once.
        events.close()
