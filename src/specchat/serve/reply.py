"""A reply as OpenAI's objects: text from the events (cut at a stop string), the finish reason,
usage, and the `specchat` extension with the decoding figures."""

import time
import uuid
from time import perf_counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import ClassVar

from specchat.decoding.events import IterationEvent
from specchat.decoding.prediction import Prediction
from specchat.decoding.token_log import TokenLog, TokenLogprobs
from specchat.serve.scheduler import Job
from specchat.serve.stops import StopScan
from specchat.serve.prediction import prediction_usage
from specchat.serve.token_bytes import token_bytes
from specchat.serve.structured import split_calls
from specchat.summary import summarize, tree_means
from specchat.textstream import TextStream


@dataclass
class Reply:
    stream: TextStream
    scan: StopScan
    stop_ids: Collection[int]
    events: list[IterationEvent] = field(default_factory=list)
    token_log: TokenLog | None = None  # logprobs asked for: the target's, token by token
    prediction: Prediction | None = None  # a predicted output: the reply's place in it, what it followed
    may_call: bool = False  # the request offers tools: the reply's <tool_call> blocks are calls
    logged: int = 0  # token_log entries already sent (streaming)
    sent: int = 0  # characters of the reply's text returned so far
    through: int | None = None  # where the reply was cut (Reply.cut): decoding counts to this character

    def push(self, event: IterationEvent) -> str:
        """The event's tokens; returns the text now safe to send."""
        self.events.append(event)
        text = self.sending(self.scan.push(self.stream.push(event.token_ids)))
        if self.scan.hit and self.through is None:  # the text ends before the stop string, which decided it
            self.cut(self.sent, self.sent + len(self.scan.word))
        return text

    def finish(self) -> str:
        """The text held back until the end."""
        return self.sending(self.scan.push(self.stream.finish()) + self.scan.finish())

    def sending(self, text: str) -> str:
        self.sent += len(text)
        return text

    def cut(self, kept: int, through: int) -> None:
        """The reply ends at `kept` characters of its text, decided by the character that ends at
        `through` (a stop string's last; llama.cpp's editor stops call it too): logprobs count to
        `kept`, usage to `through`."""
        self.sent, self.through = kept, through

    @property
    def stopped(self) -> bool:
        """A stop string was found: nothing after it is wanted."""
        return self.scan.hit

    @property
    def completion_tokens(self) -> int:
        """The reply's tokens: where it was cut (a stop string, an editor stop), those up to the one
        that decided it, as decoding token by token would have made (a tree may have accepted more
        past it: never sent)."""
        return len(self.stream.token_ids) if self.through is None else self.stream.reaching(self.through)

    @property
    def ended_by_model(self) -> bool:
        """The last token is one of the model's end tokens."""
        return bool(self.events and self.events[-1].token_ids and self.events[-1].token_ids[-1] in self.stop_ids)

    def finish_reason(self, called: bool = False) -> str:
        if called:
            return "tool_calls"
        return "stop" if self.stopped or self.ended_by_model else "length"

    def sent_tokens(self) -> int:
        """The tokens whose text begins within the text sent: not a stop string's, nor an end token
        (its text is empty, at the end), nor one held back as a stop string's possible start."""
        return self.stream.reaching(self.sent, self.logged)

    @property
    def unsent_logprobs(self) -> bool:
        """Sent tokens whose logprobs no chunk has carried yet."""
        return self.token_log is not None and self.logged < self.sent_tokens()

    def take_logged(self) -> list[TokenLogprobs] | None:
        """The entries of the tokens sent since the last call, now counted as carried (None: not
        asked for). The log may run ahead: the decoding thread fills it."""
        if self.token_log is None:
            return None
        entries = self.token_log.entries[self.logged:self.sent_tokens()]
        self.logged += len(entries)
        return entries

    def new_logprobs(self) -> dict | None:
        """OpenAI's logprobs object for the tokens sent since the last call (the whole reply's, at
        the first; None: not asked for)."""
        entries = self.take_logged()
        return None if entries is None else {"content": [logprob_entry(self.stream.tokenizer, e) for e in entries]}


def logprob_entry(tokenizer, entry: TokenLogprobs) -> dict:
    def described(token: int, logprob: float) -> dict:
        return {"token": tokenizer.decode([token]), "logprob": logprob, "bytes": list(token_bytes(tokenizer, token))}
    return described(entry.token, entry.logprob) | {"top_logprobs": [described(t, p) for t, p in entry.top]}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, reply: Reply) -> dict:
    """Tokens in and out; the prompt tokens the engine reused from its caches, once it reports them."""
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": reply.completion_tokens,
              "total_tokens": prompt_tokens + reply.completion_tokens}
    prefill = reply.events[0].prefill_tokens if reply.events else 0
    if prefill:
        counts["prompt_tokens_details"] = {"cached_tokens": prompt_tokens - prefill}
    if reply.prediction is not None:  # what it followed, of what it sent
        accepted = min(reply.prediction.accepted, reply.completion_tokens)
        counts["completion_tokens_details"] = prediction_usage(accepted, len(reply.prediction.tokens) - accepted)
    return counts


def summed_usage(replies: list[tuple[Job, Reply]], per_prompt: int = 1) -> dict:
    """The replies' usage added up: a batch's tokens in and out, and those reused from the caches;
    where a prompt has `per_prompt` choices (n), its tokens are counted once, at its first, as
    OpenAI's API counts them (the choices after it reuse its cache)."""
    counts = [usage(len(job.prompt_ids), reply) for job, reply in replies]
    firsts = counts[::per_prompt]
    total = {"prompt_tokens": sum(count["prompt_tokens"] for count in firsts),
             "completion_tokens": sum(count["completion_tokens"] for count in counts)}
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    if details := [count["prompt_tokens_details"] for count in firsts if "prompt_tokens_details" in count]:
        total["prompt_tokens_details"] = {"cached_tokens": sum(detail["cached_tokens"] for detail in details)}
    if predicted := [count["completion_tokens_details"] for count in counts if "completion_tokens_details" in count]:
        total["completion_tokens_details"] = {key: sum(detail[key] for detail in predicted) for key in predicted[0]}
    return total


def figures(replies: list[tuple[Job, Reply]]) -> dict | list[dict]:
    """The `specchat` figures of a reply, or a list of them, one a choice, for several."""
    each = [extension(job, reply) for job, reply in replies]
    return each[0] if len(each) == 1 else each


def extension(job: Job, reply: Reply) -> dict:
    """The `specchat` object: how the reply was decoded and how long it waited."""
    events = reply.events
    # A reply cut at a stop string is answered before its decode has stopped: timed until now.
    summary = summarize(events, (job.ended_s or perf_counter()) - job.started_s if job.started else 0.0)
    means = tree_means(events)
    return {
        "engine": job.engine,
        "iterations": summary.iterations,
        "gen_rate": summary.gen_rate,
        "accepted_per_iteration": means.accepted,
        "tree_size": means.tree_size,
        "draft_s": summary.draft_s,
        "target_s": summary.target_s,
        "transfer_s": summary.transfer_s,
        "tokens_per_s": summary.tokens_per_s,
        "prefill_tokens": events[0].prefill_tokens if events else 0,
        "prefill_s": events[0].prefill_s if events else 0.0,
        "seed": job.sampling.seed,  # drawn where the request gave none: sent back, the reply repeats
        "queue_s": job.queue_s,
        "arrived": job.arrived,  # the order requests were accepted in ...
        "started": job.started,  # ... and the order they started in: equal orders are FIFO
    }


def completion(model: str, texts: list[str], replies: list[tuple[Job, Reply]]) -> dict:
    """The whole answer: a choice a reply (several where the request asks n), their usage summed."""
    return {
        "id": completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [chat_choice(index, text, reply) for index, (text, (_, reply)) in enumerate(zip(texts, replies))],
        "usage": summed_usage(replies, len(replies)), "specchat": figures(replies),
    }


def chat_choice(index: int, text: str, reply: Reply) -> dict:
    content, calls = split_calls(text) if reply.may_call else (text, [])
    message = {"role": "assistant", "content": content} | ({"tool_calls": calls} if calls else {})
    return {"index": index, "message": message, "logprobs": reply.new_logprobs(),
            "finish_reason": reply.finish_reason(bool(calls))}


@dataclass(frozen=True)
class ChunkSeries:
    """The chunks of one streamed reply, sharing its id and creation time (`OBJECT`: their type)."""

    OBJECT: ClassVar[str]
    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, choices: list[dict], **extra: object) -> dict:
        return {"id": self.id, "object": self.OBJECT, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def summed(self, replies: list[tuple[Job, Reply]], per_prompt: int = 1) -> dict:
        """The chunk with the usage of every choice."""
        return self.chunk([], usage=summed_usage(replies, per_prompt))


@dataclass(frozen=True)
class Chunks(ChunkSeries):
    """A streamed chat reply's chunks: deltas of its message."""

    OBJECT: ClassVar[str] = "chat.completion.chunk"
    id: str = field(default_factory=completion_id)

    def delta(self, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None, index: int = 0,
              **extra: object) -> dict:
        return self.chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
                          **extra)

    def calls(self, calls: list[dict], index: int = 0) -> dict:
        """The reply's tool calls, whole, in one delta (clients join a call's deltas by their index)."""
        return self.delta({"tool_calls": [{"index": number, **call} for number, call in enumerate(calls)]},
                          index=index)

    def last(self, reply: Reply, job: Job, called: bool = False, index: int = 0) -> dict:
        return self.delta({}, reply.finish_reason(called), index=index, specchat=extension(job, reply))
