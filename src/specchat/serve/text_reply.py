"""A text completion as OpenAI's objects (`text_completion`), whole or as chunks, with the legacy
logprobs shape: tokens, token_logprobs, top_logprobs (a {token: logprob} map each) and text_offset."""

import math
import time
import uuid
from dataclasses import dataclass, field
from itertools import accumulate
from typing import ClassVar

from transformers import PreTrainedTokenizerBase

from specchat.decoding.token_log import TokenLogprobs
from specchat.serve.reply import ChunkSeries, Reply, extension, figures, summed_usage
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


def text_completion(model: str, choices: list[dict], replies: list[tuple[Job, Reply]], per_prompt: int,
                    returned: list[tuple[Job, Reply]]) -> dict:
    """The whole answer: the `returned` replies' choices (their figures, in order), the usage of
    every reply decoded (`per_prompt` a prompt where the request asks n or best_of: every candidate's
    tokens count, as OpenAI's API bills them)."""
    return {
        "id": completion_id(), "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": choices, "usage": summed_usage(replies, per_prompt), "specchat": figures(returned),
    }


def logprob_per_token(reply: Reply) -> float:
    """What `best_of` ranks a candidate by, as OpenAI's API says: its log probability per token, the
    mean of the target's logprobs (before temperature, top-p and any grammar) of the tokens its
    usage counts; an end token among them (ending is the model's choice too). The reply must log
    its tokens (`token_log`); none (nothing decoded) ranks below every other."""
    entries = reply.token_log.entries[:reply.completion_tokens]
    return sum(entry.logprob for entry in entries) / len(entries) if entries else -math.inf


def text_choice(index: int, text: str, reply: Reply, logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reply.finish_reason()}


@dataclass(frozen=True)
class TextChunks(ChunkSeries):
    """A streamed text completion's chunks: pieces of its choices' texts, a choice after another."""

    OBJECT: ClassVar[str] = "text_completion"
    id: str = field(default_factory=completion_id)

    def text(self, text: str, logprobs: dict | None = None, finish_reason: str | None = None, index: int = 0,
             **extra: object) -> dict:
        return self.chunk([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
                          **extra)

    def last(self, reply: Reply, job: Job, index: int = 0) -> dict:
        return self.text("", finish_reason=reply.finish_reason(), index=index, specchat=extension(job, reply))
