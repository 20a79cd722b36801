"""Checking that an engine emits exactly the target's tokens (design.md section 8).

Batched tree attention and sequential decoding differ by ~1e-5 in float32, so where two tokens
nearly tie, an exact engine may pick the other one. The check walks the engine's tokens against a
reference:
- at the first difference, the engine's token must itself be near-tied: its gap (below), taken
  from a sequential float32 target forward over the common prefix, is at most NEAR_TIE;
- then it re-anchors: the target decodes sequentially from the engine's prefix (up to and
  including that token) with the same sampling, and the engine's remaining tokens are compared
  with that, to the end;
- every accepted near-tie is counted, and at most MAX_TIES per prompt pass.
Any other difference fails: the comparison is never loosened otherwise.

Used by the real-pair exactness tests and by scripts/check_exactness.py.
"""

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from math import log1p

import torch
from transformers import DynamicCache

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.dynatemp import dynamic_temperature
from specchat.decoding.sampling import emit_token, position_cuts, sampled_probs, uniform

NEAR_TIE = 1e-4  # in logits
MAX_TIES = 1  # per prompt


@dataclass(frozen=True)
class Tie:
    index: int  # into the generated tokens
    gap: float  # the engine token's gap there (< NEAR_TIE)


@dataclass(frozen=True)
class Comparison:
    ties: tuple[Tie, ...] = ()
    mismatch: int | None = None  # the first difference that is not an accepted near-tie
    gap: float | None = None  # the engine token's gap at `mismatch`; None when one list just ends first
    max_ties: int = MAX_TIES  # the checker's bound on near-ties per prompt

    @property
    def identical(self) -> bool:
        return not self.ties and self.mismatch is None

    @property
    def acceptable(self) -> bool:
        return self.mismatch is None and len(self.ties) <= self.max_ties

    def describe(self) -> str:
        """One line for reports: each tie, then how the comparison ended."""
        ties = "".join(f"tie at token {t.index} (gap {t.gap:.1e}), then " for t in self.ties)
        if self.mismatch is None:
            end = "identical"
        elif self.gap is None:
            end = f"lengths differ at token {self.mismatch}"
        else:
            end = f"diverged at token {self.mismatch} (gap {self.gap:.1e})"
        too_many = f" ({len(self.ties)} ties, at most {self.max_ties})" if len(self.ties) > self.max_ties else ""
        return ties + end + too_many + ("" if self.acceptable else ": FAIL")


def greedy_gap(logits: torch.Tensor, token: int) -> float:
    """How far `token` is below the maximum logit: moving every logit by at most d/2 can make
    it the argmax exactly when this gap is at most d."""
    return float(logits.max() - logits[token])


def sampled_gap(logits: torch.Tensor, token: int, sampling: SamplingParams, position: int) -> float:
    """A lower bound on the logit spread 2d that makes seeded sampling pick `token`.

    Sampling picks token i when u lies in [C(i-1), C(i)), C the normalised cumulative filtered
    distribution in token-id order (specchat.decoding.sampling). Moving every logit by at most d
    scales each probability by a factor within exp(+-2d/T) (numerator and normaliser each move
    within exp(+-d/T)), so every C(i) moves by at most exp(2d/T) - 1. With u at distance r from
    the token's interval, r <= exp(2d/T) - 1, i.e. 2d >= T log(1 + r). A top-p cut that moves
    with the logits is not modelled: such a flip has a large r and fails, it never passes. Under a
    dynamic temperature T is the position's own (decoding/dynatemp.py), its own move with the
    logits likewise not modelled.
    """
    if sampling.mirostat is not None:  # its cut at the reply's mu there, in place of the others
        probs = sampling.mirostat.probs(logits / sampling.temperature)
    else:
        probs = sampled_probs(logits, sampling, position)
    cdf = probs.cumsum(dim=0) / probs.sum()
    low = float(cdf[token - 1]) if token > 0 else 0.0
    high = float(cdf[token])
    u = uniform(sampling.seed, position)
    distance = max(low - u, u - high, 0.0)
    return position_temperature(logits, sampling, position) * log1p(distance)


def position_temperature(logits: torch.Tensor, sampling: SamplingParams, position: int) -> float:
    """The temperature sampling divides this position's logits by: the reply's, or the dynamic one
    set by what the cuts at temperature 1 kept."""
    if sampling.dynatemp_range <= 0 or sampling.mirostat is not None:
        return sampling.temperature
    return float(dynamic_temperature(position_cuts(logits, sampling, position, 1.0), sampling.temperature,
                                     sampling.dynatemp_range, sampling.dynatemp_exponent))


def counted_afresh(sampling: SamplingParams, prompt_ids: list[int], emitted: list[int],
                   rows: torch.Tensor | None = None) -> SamplingParams:
    """`sampling` with its penalties' and its mirostat's states moved from the start by `emitted`
    after `prompt_ids` (the states the engine was given are spent on its own run); mirostat's mu
    moves by each token's surprise under the target's logits `rows` (rows[j]: those that chose
    emitted[j])."""
    repeats = None if sampling.penalties is None else sampling.penalties.penalties.start(prompt_ids)
    surprise = None if sampling.mirostat is None else sampling.mirostat.spec.start()
    for index, token in enumerate(emitted):
        if surprise is not None and sampling.temperature > 0:
            scores = rows[index] if repeats is None else repeats.penalized(rows[index])
            surprise.move(surprise.probs(scores / sampling.temperature), token)
        if repeats is not None:
            repeats.accept(token)
    return replace(sampling, penalties=repeats, mirostat=surprise)


def scored(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The logits sampling reads: with the reply's bias and penalties where it has them."""
    return logits if sampling.penalties is None else sampling.penalties.penalized(logits)


def token_gap(logits: torch.Tensor, token: int, sampling: SamplingParams, position: int) -> float:
    """0 when the target itself picks `token` here; below NEAR_TIE for a near-tie."""
    if sampling.temperature == 0:
        return greedy_gap(logits, token)
    return sampled_gap(logits, token, sampling, position)


@dataclass
class Sequential:
    """The target decoding one token per forward, as plain autoregressive decoding does."""

    target: CausalLM
    cache: DynamicCache = field(default_factory=new_cache)
    position: int = 0  # tokens fed so far = the absolute position of the next token
    logits: torch.Tensor | None = None  # float32 logits for the token at `position`

    def feed(self, ids: list[int]) -> None:
        positions = torch.arange(self.position, self.position + len(ids))
        hidden = self.target.hidden(torch.tensor(ids), positions, self.cache)
        self.logits = self.target.logits(hidden[-1:])[0]
        self.position += len(ids)

    def decode(self, first: int, count: int, sampling: SamplingParams, stop_ids: Collection[int]) -> list[int]:
        """Feed `first`, then sample up to `count` tokens at their absolute positions, ending
        after a stop token (nothing follows a `first` that is one); `sampling`'s penalties, if
        any, have counted `first`."""
        decoded: list[int] = []
        token = first
        while len(decoded) < count and token not in stop_ids:
            self.feed([token])
            token = emit_token(self.logits, sampling, self.position)  # its penalties and mirostat move past it
            decoded.append(token)
        return decoded


def first_difference(reference: list[int], tokens: list[int], start: int) -> int | None:
    """The first index >= start where the lists differ, or where one of them has ended first."""
    for index in range(start, max(len(reference), len(tokens))):
        if index >= len(reference) or index >= len(tokens) or reference[index] != tokens[index]:
            return index
    return None


@dataclass(frozen=True)
class ExactnessCheck:
    """Compares engine output with a reference decoded by the same target, stops and length."""

    target: CausalLM
    stop_ids: frozenset[int]
    max_new_tokens: int
    near_tie: float = NEAR_TIE  # float32's; bf16 comparisons pass docs/exactness.md's bf16 bound
    max_ties: int = MAX_TIES  # per prompt; float32's, bf16 seeded comparisons pass their own

    def compare(self, prompt_ids: list[int], reference: list[int], tokens: list[int],
                sampling: SamplingParams) -> Comparison:
        """`reference`: the target's own tokens after `prompt_ids` (HF greedy or seeded
        autoregressive); `tokens`: the engine's. Ties re-anchor the reference (module docstring)."""
        ties: list[Tie] = []
        start = 0
        while (index := first_difference(reference, tokens, start)) is not None:
            if index >= min(len(reference), len(tokens)):
                return Comparison(tuple(ties), mismatch=index, max_ties=self.max_ties)
            sequential = Sequential(self.target)
            sequential.feed(prompt_ids + tokens[:index])
            rows = self.reply_rows(prompt_ids, tokens[:index + 1]) if sampling.mirostat is not None else None
            here = counted_afresh(sampling, prompt_ids, tokens[:index], rows)
            gap = token_gap(scored(sequential.logits, here), tokens[index], here, sequential.position)
            if gap > self.near_tie:
                return Comparison(tuple(ties), mismatch=index, gap=gap, max_ties=self.max_ties)
            ties.append(Tie(index, gap))
            rest = sequential.decode(tokens[index], self.max_new_tokens - index - 1,
                                     counted_afresh(sampling, prompt_ids, tokens[:index + 1], rows), self.stop_ids)
            reference = tokens[: index + 1] + rest
            start = index + 1
        return Comparison(tuple(ties), max_ties=self.max_ties)

    def reply_rows(self, prompt_ids: list[int], emitted: list[int]) -> torch.Tensor:
        """The target's float32 logits [len(emitted), V] that chose each emitted token (one forward:
        mirostat's mu replayed from them may differ from the engine's by float32's rounding, which
        moves a cut only at its edge, where the checker's gaps see it)."""
        ids = prompt_ids + emitted
        hidden = self.target.hidden(torch.tensor(ids), torch.arange(len(ids)), new_cache())
        return self.target.logits(hidden[len(prompt_ids) - 1:-1])


def hf_greedy(target: CausalLM, prompt_ids: list[int], max_new_tokens: int, stop_ids, pad_id: int | None) -> list[int]:
    """The greedy reference: transformers' own `generate(do_sample=False)`."""
    out = target.model.generate(
        torch.tensor([prompt_ids], device=target.device), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=sorted(stop_ids), pad_token_id=pad_id,
    )
    return out[0, len(prompt_ids):].tolist()
