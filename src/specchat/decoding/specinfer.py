"""SpecInfer (Miao et al. 2023), SpecExec's baseline: i.i.d. draft stems merged into a token tree
(stems.py), one target pass over the tree, multi-step speculative sampling down the tree
(speculative_sampling.py). The loop and cache handling are `TreeEngine`'s.

Budget rule: K draft tokens are split into S = K // L stems of length L = min(D, isqrt(K)), so
the tree never has more than S * L <= K nodes whatever the samples (merging shared prefixes only
shrinks it; cutting stems by what they sampled would bias the candidates). A stem is accepted to
depth d with probability decaying geometrically in d, while more stems raise the chance that some
candidate is accepted at each node; the square split balances the two (K=16: 4 x 4, K=64: 8 x 8,
K=256: 16 x 16). At temperature 0 every stem would be the draft's argmax chain, so the whole
budget goes to one stem of length min(D, K), the greedy chain.
"""

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from specchat.decoding.drafter import Root, TreeShape
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.speculative_sampling import distribution, emit, first_accepted
from specchat.decoding.stems import StemLayout, Stems, draft_stems
from specchat.decoding.tree_engine import TreeEngine
from specchat.decoding.verifier import Verdict, descend

Layout = Callable[[TreeShape, float], StemLayout]  # (live tree shape, temperature) -> stems


def specinfer_layout(shape: TreeShape, temperature: float) -> StemLayout:
    """The module docstring's rule."""
    if temperature == 0:
        return StemLayout(stems=1, length=min(shape.max_depth, shape.budget))
    length = min(shape.max_depth, math.isqrt(shape.budget))
    return StemLayout(stems=shape.budget // length, length=length)


@dataclass(frozen=True)
class SpecInferStrategy:
    """Stems laid out by `layout`, walked by multi-step speculative sampling."""

    layout: Layout = specinfer_layout
    # its acceptance weighs the draft's probabilities, which a grammar would have to mask alike
    guided = False

    def draft(self, draft: CausalLM, cache: DynamicCache, root: Root, shape: TreeShape,
              sampling: SamplingParams) -> Stems:
        return draft_stems(draft, cache, root, self.layout(shape, sampling.temperature), sampling)

    def walk(self, drafted: Stems, node_logits: Callable[[int], torch.Tensor], sampling: SamplingParams,
             first_position: int, max_tokens: int, stop_ids: Collection[int]) -> Verdict:
        """From the root, test each node's candidates against the target
        (speculative_sampling.py); move to an accepted child, or emit from the residual and stop."""
        tokens = drafted.tree.tokens.tolist()

        def step(node: int, position: int) -> tuple[int, int | None]:
            p = distribution(node_logits(node), sampling)
            child, p = choose_child(drafted, node, tokens, p, sampling, position)
            return (tokens[child], child) if child is not None else (emit(p, sampling.seed, position), None)

        return descend(step, first_position, max_tokens, stop_ids)


def SpecInferEngine(target: CausalLM, draft: CausalLM, stop_ids: Collection[int], shape: TreeShape) -> TreeEngine:
    """The SpecInfer engine: a `TreeEngine` with the square stem layout."""
    return TreeEngine("specinfer", SpecInferStrategy(), target, draft, stop_ids, shape)


def choose_child(
    stems: Stems, node: int, tokens: list[int], p: torch.Tensor, sampling: SamplingParams, position: int
) -> tuple[int | None, torch.Tensor]:
    """The accepted candidate child of `node`, or None and the distribution to emit from."""
    candidates = stems.candidates[node]
    if not candidates:  # a leaf: the bonus token comes from p itself
        return None, p
    q = distribution(stems.draft_logits[node], sampling)
    rank, p = first_accepted(p, q, [tokens[child] for child in candidates], sampling.seed, position)
    return (candidates[rank] if rank is not None else None), p
