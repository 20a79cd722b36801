"""What a decoding thread runs for one reply, made by the session and run by `decoder`."""

import threading
from dataclasses import dataclass, field

from specchat.decoding.events import Engine, SamplingParams
from specchat.tui.backend import ReplyStream


@dataclass
class ReplyJob:
    id: int
    engine: Engine
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stream: ReplyStream
    cancel: threading.Event = field(default_factory=threading.Event)
