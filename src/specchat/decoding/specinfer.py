"""SpecInfer (Miao et al. 2023), SpecExec's baseline: i.i.d. draft stems merged into a token tree
(stems.py), one target pass over the tree, multi-step speculative sampling down the tree
(speculative_sampling.py): SpecExec's iteration (specexec.py) with another grow and walk.

Budget rule: K draft tokens are split into S = K // L stems of length L = min(D, isqrt(K)), so
the tree never has more than S * L <= K nodes whatever the samples (merging shared prefixes only
shrinks it; cutting stems by what they sampled would bias the candidates). A stem is accepted to
depth d with probability decaying geometrically in d, while more stems raise the chance that some
candidate is accepted at each node; the square split balances the two (K=16: 4 x 4, K=64: 8 x 8,
K=256: 16 x 16). At temperature 0 every stem would be the draft's argmax chain, so the whole
budget goes to one stem of length min(D, K), the greedy chain.
"""

import math
from collections.abc import Collection

import torch

from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import NodeRows, TreeStrategy, Verdict, descend
from specchat.decoding.speculative_sampling import distribution, emit, first_accepted
from specchat.decoding.stems import StemLayout, Stems, stem_growth
from specchat.decoding.tree import TreeShape


def specinfer_layout(shape: TreeShape, temperature: float) -> StemLayout:
    """The module docstring's rule."""
    if temperature == 0:
        return StemLayout(stems=1, length=min(shape.max_depth, shape.budget))
    length = min(shape.max_depth, math.isqrt(shape.budget))
    return StemLayout(stems=shape.budget // length, length=length)


def walk_stems(stems: Stems, node_logits: NodeRows, sampling: SamplingParams, first_position: int,
               max_tokens: int, stop_ids: Collection[int]) -> Verdict:
    """From the root, test each node's candidates against the target (speculative_sampling.py);
    move to an accepted child, or emit from the residual and stop."""
    tokens = stems.tree.tokens.tolist()

    def step(node: int, position: int) -> tuple[int, int | None]:
        p = distribution(node_logits(node), sampling, position)
        child, p = choose_child(stems, node, tokens, p, sampling, position)
        return (tokens[child], child) if child is not None else (emit(p, sampling.seed, position), None)

    return descend(step, first_position, max_tokens, stop_ids)


def choose_child(
    stems: Stems, node: int, tokens: list[int], p: torch.Tensor, sampling: SamplingParams, position: int
) -> tuple[int | None, torch.Tensor]:
    """The accepted candidate child of `node`, or None and the distribution to emit from."""
    candidates = stems.candidates[node]
    if not candidates:  # a leaf: the bonus token comes from p itself
        return None, p
    q = distribution(stems.draft_logits[node], sampling, position)
    rank, p = first_accepted(p, q, [tokens[child] for child in candidates], sampling.seed, position)
    return (candidates[rank] if rank is not None else None), p


# Its acceptance weighs the draft's probabilities, which a grammar would have to mask alike: unguided.
SPECINFER = TreeStrategy("specinfer", grow=stem_growth(specinfer_layout), walk=walk_stems, guided=False)
