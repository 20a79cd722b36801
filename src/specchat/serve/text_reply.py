"""A text completion as OpenAI's objects (`text_completion`), whole or as chunks, with the legacy
logprobs shape: tokens, token_logprobs, top_logprobs (a {token: logprob} map each) and text_offset."""

import time
import uuid
from itertools import accumulate
from dataclasses import dataclass, field
from typing import ClassVar

from transformers import PreTrainedTokenizerBase

from specchat.decoding.token_log import TokenLogprobs
from specchat.serve.reply import ChunkSeries, Reply, extension, usage
from specchat.serve.scheduler import Job


@dataclass
class LegacyLogprobs:
    """The logprobs of a reply's tokens in chunks, each token's text_offset counted on from `offset`
    (where the completion's text starts in the choice: after the prompt when echoed)."""

    tokenizer: PreTrainedTokenizerBase
    offset: int = 0

    def take(self, reply: Reply) -> dict | None:
        """The reply's entries logged since they were last taken (None: logprobs were not asked for)."""
        entries = reply.take_logged()
        if entries is None:
            return None
        tokens = [self.tokenizer.decode([entry.token]) for entry in entries]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": [entry.logprob for entry in entries],
                "top_logprobs": [self.alternatives(entry) for entry in entries], "text_offset": offsets}

    def prompt(self, prompt_ids: list[int], entries: list[TokenLogprobs]) -> dict:
        """The echoed prompt's entries, as OpenAI's: its tokens from text offset 0, the first with no
        logprob and no alternatives (nothing came before it), each other as the target scored it."""
        tokens = [self.tokenizer.decode([token]) for token in prompt_ids]
        offsets = [0, *accumulate(len(text) for text in tokens[:-1])]
        return {"tokens": tokens, "token_logprobs": [None] + [entry.logprob for entry in entries],
                "top_logprobs": [None] + [self.alternatives(entry) for entry in entries], "text_offset": offsets}

    def alternatives(self, entry: TokenLogprobs) -> dict[str, float]:
        return {self.tokenizer.decode([token]): logprob for token, logprob in entry.top}


def joined(first: dict | None, then: dict | None) -> dict | None:
    """Two runs of legacy logprobs as one (the echoed prompt's, then the completion's)."""
    if first is None or then is None:
        return first or then
    return {key: first[key] + then[key] for key in first}


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def text_completion(model: str, text: str, reply: Reply, job: Job, logprobs: dict | None) -> dict:
    return {
        "id": completion_id(), "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reply.finish_reason()}],
        "usage": usage(len(job.prompt_ids), reply),
        "specchat": extension(job, reply),
    }


@dataclass(frozen=True)
class TextChunks(ChunkSeries):
    """A streamed text completion's chunks: pieces of its text."""

    OBJECT: ClassVar[str] = "text_completion"
    id: str = field(default_factory=completion_id)

    def text(self, text: str, logprobs: dict | None = None, finish_reason: str | None = None,
             **extra: object) -> dict:
        return self.chunk([{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}], **extra)

    def last(self, reply: Reply, job: Job) -> dict:
        return self.text("", finish_reason=reply.finish_reason(), specchat=extension(job, reply))
