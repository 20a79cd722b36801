"""DRY, "Don't Repeat Yourself" (p-e-w 2024), as llama.cpp's sampler penalizes repetition: a token
that would extend a sequence already in the context, L tokens long (L >= allowed_length), loses
multiplier x base^(L - allowed_length) from its logit (the exponent capped where the power would
overflow a float). The context is the last `last_n` tokens of the prompt and the reply (-1: all
of them), and a repeat counts back no further than the last sequence breaker: the tokens a
breaker string (by default "\\n", ":", "\\"" and "*") is written in, as llama.cpp finds them (a
token whose text holds the string, or starts it, the rest of it tokenized as the tokens after).
A token that is a breaker by itself is never penalized.

Why speculation stays exact: the penalty at position n depends only on the tokens before n, as the
repetition penalties' (penalties.py, which applies it after them): at a tree node on the emitted
path it is what sequential decoding computes.
"""

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from transformers import PreTrainedTokenizerBase

DEFAULT_BREAKERS = ("\n", ":", "\"", "*")  # llama.cpp's
MAX_BREAKER_CHARACTERS, MAX_TAIL_TOKENS = 40, 20  # llama.cpp's bounds on a breaker and its tokens after the first
FLOAT_MAX_LOG = 88.7228391  # ln of float32's largest: base^exponent stays below it

Restarts = tuple[tuple[int, tuple[int, ...]], ...]  # (a breaker's first token, the tokens after it)


@dataclass(frozen=True)
class Dry:
    """One request's DRY: off where `multiplier` is 0, `base` below 1 or `last_n` 0."""

    multiplier: float = 0.0
    base: float = 1.75
    allowed_length: int = 2
    last_n: int = -1  # -1: the whole context
    restarts: Restarts = ()  # the breakers' tokens (restart_sequences)

    @property
    def active(self) -> bool:
        return self.multiplier != 0.0 and self.base >= 1.0 and self.last_n != 0


def dry_of(multiplier: float, base: float, allowed_length: int, last_n: int, tokenizer: PreTrainedTokenizerBase,
           breakers: Sequence[str] = DEFAULT_BREAKERS) -> Dry | None:
    """A request's DRY over `tokenizer`'s words, None where it is off (no breaker is tokenized then)."""
    return dry_when_on(multiplier, base, allowed_length, last_n, lambda: restart_sequences(tokenizer, tuple(breakers)))


def dry_when_on(multiplier: float, base: float, allowed_length: int, last_n: int,
                restarts: Callable[[], Restarts]) -> Dry | None:
    """DRY with the breakers' tokens `restarts` gives, asked only where it is on; None where it is off."""
    dry = Dry(multiplier, base, allowed_length, last_n)
    return replace(dry, restarts=restarts()) if dry.active else None


@lru_cache(maxsize=8)
def restart_sequences(tokenizer: PreTrainedTokenizerBase, breakers: tuple[str, ...]) -> Restarts:
    """Each breaker as the tokens that write it, as llama.cpp's get_overlapping_token_sequences finds
    them: a word holding the whole string is a breaker alone; a word ending in the string's start is
    its first token, the rest of the string tokenized (at most MAX_TAIL_TOKENS) the tokens after."""
    words = word_texts(tokenizer)
    found: dict[tuple[int, tuple[int, ...]], None] = {}
    for breaker in (text[:MAX_BREAKER_CHARACTERS] for text in breakers if text):
        for token, word in enumerate(words):
            if breaker in word:
                found[(token, ())] = None
                continue
            for start in (index for index, character in enumerate(word) if character == breaker[0]):
                if breaker.startswith(word[start:]):
                    rest = breaker[len(word) - start:]
                    found[(token, tuple(tokenizer.encode(rest, add_special_tokens=False)[:MAX_TAIL_TOKENS]))] = None
    return tuple(found)


@lru_cache(maxsize=2)
def word_texts(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Each token id's text (~1 s for Qwen2.5's 151,665 words, once a tokenizer)."""
    return tokenizer.batch_decode([[token] for token in range(len(tokenizer))])


class DryWindow:
    """One reply's DRY at the tokens emitted so far (the prompt's first)."""

    def __init__(self, dry: Dry, prompt_ids: Sequence[int]) -> None:
        self.dry = dry
        self.tokens: deque[int] = deque(prompt_ids, maxlen=None if dry.last_n < 0 else dry.last_n)
        self.tails: dict[int, list[tuple[int, ...]]] = {}
        for head, tail in dry.restarts:
            self.tails.setdefault(head, []).append(tail)
        self.alone = {head for head, tail in dry.restarts if not tail}  # breakers by themselves: never penalized

    def accept(self, token: int) -> None:
        self.tokens.append(token)

    def penalize(self, scores: torch.Tensor) -> None:
        """Subtract the penalty from `scores` [V] (float32, in place) at the current position."""
        longest = self.repeats()
        if not longest:
            return
        dry = self.dry
        cap = FLOAT_MAX_LOG / math.log(dry.base) if dry.base > 1.000001 else 0
        ids = torch.tensor(list(longest), dtype=torch.long, device=scores.device)
        exponents = torch.tensor([length - dry.allowed_length for length in longest.values()], dtype=torch.float32)
        if cap > 0:
            exponents = exponents.clamp(max=float(int(cap)))
        scores[ids] -= (dry.multiplier * torch.pow(torch.tensor(dry.base, dtype=torch.float32), exponents)).to(
            scores.device)

    def repeats(self) -> dict[int, int]:
        """The longest repeat each token would extend, where at least allowed_length (and the token
        is no breaker by itself)."""
        tokens, allowed = list(self.tokens), self.dry.allowed_length
        if len(tokens) <= allowed:
            return {}
        limit = self.breaker_limit(tokens)
        if limit < allowed:
            return {}
        longest: dict[int, int] = {}
        for end, length in suffix_matches(tokens, limit):
            if length >= allowed:
                token = tokens[end + 1]
                if token not in self.alone and longest.get(token, -1) < length:
                    longest[token] = length
        return longest

    def breaker_limit(self, tokens: list[int]) -> int:
        """How far back a repeat may reach: up to the most recent breaker (its tokens written out)."""
        for back in range(len(tokens)):
            tails = self.tails.get(tokens[-1 - back])
            if tails is None:
                continue
            matched = [len(tail) for tail in tails if len(tail) <= back and
                       all(tail[offset] == tokens[-back + offset] for offset in range(len(tail)))]
            if matched:
                return back - max(matched)
        return len(tokens)


def suffix_matches(tokens: list[int], limit: int) -> list[tuple[int, int]]:
    """(end, length) for each earlier position `end`: how many tokens ending there match the
    sequence's last ones (capped at `limit`), by the Z-algorithm over the reversed sequence, in
    O(len(tokens))."""
    backwards = tokens[::-1]
    size = len(backwards)
    z = [0] * size
    left = right = 0
    for k in range(1, size):
        if k < right:
            z[k] = min(right - k, z[k - left])
        while k + z[k] < size and backwards[z[k]] == backwards[k + z[k]]:
            z[k] += 1
        if k + z[k] > right:
            left, right = k, k + z[k]
    return [(size - 1 - k, min(z[k], limit)) for k in range(1, size)]
