"""Checking that an engine emits exactly the target's tokens (design.md section 8).

Batched tree attention and sequential decoding differ by ~1e-5 in float32, so on a near-tie
the argmax can flip. A divergence from a reference is therefore accepted only at a position
where the target's top-2 logit gap is below NEAR_TIE; any other difference is a failure.
"""

from dataclasses import dataclass

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache

NEAR_TIE = 1e-4


@dataclass(frozen=True)
class Comparison:
    identical: bool
    first_divergence: int | None  # index into the generated tokens
    gap: float | None  # target top-2 logit gap at the divergence

    @property
    def acceptable(self) -> bool:
        return self.identical or (self.gap is not None and self.gap < NEAR_TIE)


def top2_gap(target: CausalLM, ids: list[int]) -> float:
    """Target's top-2 logit gap for the token after `ids`, computed sequentially."""
    hidden = target.hidden(torch.tensor(ids), torch.arange(len(ids)), new_cache())
    top = target.logits(hidden[-1:])[0].topk(2).values
    return float(top[0] - top[1])


def compare_greedy(target: CausalLM, prompt_ids: list[int], reference: list[int], tokens: list[int]) -> Comparison:
    """Identical, or diverging first at a near-tie of the target (then the rest can differ)."""
    n = min(len(reference), len(tokens))
    first = next((i for i in range(n) if reference[i] != tokens[i]), None)
    if first is None:
        same_length = len(reference) == len(tokens)
        return Comparison(identical=same_length, first_divergence=None if same_length else n, gap=None)
    return Comparison(identical=False, first_divergence=first, gap=top2_gap(target, prompt_ids + reference[:first]))


def hf_greedy(target: CausalLM, prompt_ids: list[int], max_new_tokens: int, stop_ids, pad_id: int | None) -> list[int]:
    """The reference: transformers' own `generate(do_sample=False)`."""
    out = target.model.generate(
        torch.tensor([prompt_ids], device=target.device), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=sorted(stop_ids), pad_token_id=pad_id,
    )
    return out[0, len(prompt_ids):].tolist()
