"""The decoding loop that runs in a worker thread: engine events in, app messages out."""

import threading
from collections.abc import Callable

from textual.message import Message

from specchat.reply_loop import run_reply
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
    run_reply(job.engine, job.prompt_ids, job.max_new_tokens, job.sampling, job.cancel,
              on_event=lambda event: post(IterationArrived(job.id, event, job.stream.push(event.token_ids))),
              on_notice=lambda notice: post(EngineNotice(notice)))
