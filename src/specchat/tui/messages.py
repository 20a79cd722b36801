"""Messages the worker threads post to the app or its loading screen (posting a Textual message
is thread-safe).

A worker's failure reaches them as its Worker.StateChanged event, with the exception.
"""

from dataclasses import dataclass

from textual.message import Message

from specchat.decoding.events import IterationEvent
from specchat.errors import SpecchatError
from specchat.tui.backend import ChatBackend


def describe(error: BaseException) -> str:
    """A worker's failure in one line: a SpecchatError is already worded for the user, others get
    their type."""
    return str(error) if isinstance(error, SpecchatError) else f"{type(error).__name__}: {error}"


@dataclass
class IterationArrived(Message):
    reply_id: int
    event: IterationEvent
    text: str  # newly stable reply text


@dataclass
class EngineNotice(Message):
    text: str  # an event's one-line remark on the engine (e.g. too few dsi workers)


@dataclass
class ReplyFinished(Message):
    reply_id: int
    text: str  # text held back until the end (see TextStream.finish)


@dataclass
class LoadProgress(Message):
    step: str
    fraction: float | None


@dataclass
class BackendLoaded(Message):
    backend: ChatBackend
