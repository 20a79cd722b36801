"""Prefix reuse across replies: an engine keeps the KV caches of the last sequence it produced,
and a new prompt prefills only what follows its longest common prefix with that sequence.

Every engine (autoregressive, the tree engines, dsi's drafter and its target workers) holds one
`PrefixCache`. Its invariant: each cache holds the keys and values of some prefix of `tokens`,
each cache its own length (a tree engine's draft cache may lag its target cache). A new prompt
cuts every cache to the common prefix, so in a chat:
- a new turn reuses everything up to the previous reply (the chat template re-encodes that reply,
  so reuse ends where its tokens differ from the ones generated, usually at its end marker);
- /retry sends the previous prompt again: everything but its last token is reused;
- a reply cut short leaves `tokens` = what was generated; the kept part of it matches.
At least one prompt token is always left to run: the row whose logits give the first new token.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from specchat.decoding.events import IterationEvent
from specchat.decoding.kvcache import SlotCache, cache_length, new_cache, truncate

T = TypeVar("T")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Reuse:
    """What `PrefixCache.begin` hands an engine for one reply."""

    tokens: list[int]  # the prompt, which the engine extends in place as it commits tokens
    caches: list[SlotCache]
    reused: int  # prompt tokens the first cache (the target's) holds (at most len(prompt) - 1)
    prefill_tokens: int  # prompt tokens the reply must run: those past the reused prefix


class PrefixCache:
    """`count` KV caches (e.g. target and draft) and the token sequence they hold a prefix of."""

    def __init__(self, count: int, reuse: bool = True) -> None:
        self.count = count
        self.reuse = reuse  # False: every prompt is prefilled in full, as before issue 14 (benchmarks)
        self.tokens: list[int] = []
        self.caches = [new_cache() for _ in range(count)]

    def begin(self, prompt: Sequence[int], limit: int | None = None) -> Reuse:
        """Cut every cache to the common prefix of `prompt` and the last sequence, at most
        `limit` tokens (default len(prompt) - 1); the returned `tokens` list is the one the
        caches now follow. A cache may hold less than that prefix (a draft cache lagging, a
        worker's job cut short): each engine runs each cache on from its own length."""
        limit = len(prompt) - 1 if limit is None else limit
        keep = min(common_prefix(self.tokens, prompt), limit) if self.reuse else 0
        for cache in self.caches:
            truncate(cache, keep)
        self.tokens = list(prompt)
        reused = cache_length(self.caches[0])
        return Reuse(self.tokens, self.caches, reused, len(prompt) - reused)

    def forget(self) -> None:
        """Drop the caches (their memory goes once no reply uses them). A reply still running
        keeps the objects it was handed and finishes on them undisturbed."""
        self.tokens = []
        self.caches = [new_cache() for _ in range(self.count)]

    def guard(self, events: Iterator[IterationEvent]) -> Iterator[IterationEvent]:
        """Pass a reply's events through. Engines keep the invariant at every yield, so a reply
        closed there (a cut) leaves usable caches; an error anywhere else may leave them out of
        step with `tokens`, so they are dropped."""
        try:
            yield from events
        except GeneratorExit:
            raise
        except BaseException:
            self.forget()
            raise

    def from_start(self, prompt: Sequence[int], compute: Callable[[SlotCache], T]) -> T:
        """`compute` run on the first cache (the target's) cut to nothing, for a pass of `prompt`
        from position 0 (a prompt's scoring): after it the caches follow `prompt`, so that a reply to
        it reuses all of it but its last token; a failure drops them."""
        cache = self.begin(prompt, limit=0).caches[0]
        try:
            return compute(cache)
        except BaseException:
            self.forget()
            raise


def with_prefill(event: IterationEvent, reuse: Reuse, seconds: float) -> IterationEvent:
    """A reply's first event, carrying the prompt tokens it ran and the seconds that took."""
    return replace(event, prefill_tokens=reuse.prefill_tokens, prefill_s=seconds)
