"""Chain speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

The draft samples one chain of k = min(K, D) tokens, one target pass scores it, and each token
is accepted with probability min(1, p / q); the first rejection emits a sample of the residual
norm(max(p - q, 0)), a fully accepted chain a bonus token from p. That is SpecInfer's multi-step
speculative sampling with a single stem (one candidate per node), so the strategy is SpecInfer's
walk over a one-stem layout; the math lives in speculative_sampling.py.
"""

from specchat.decoding.specexec import TreeStrategy
from specchat.decoding.specinfer import walk_stems
from specchat.decoding.stems import StemLayout, stem_growth
from specchat.decoding.tree import TreeShape


def chain_layout(shape: TreeShape, temperature: float) -> StemLayout:
    """One stem: the whole budget, capped by the maximum depth (at any temperature)."""
    return StemLayout(stems=1, length=min(shape.max_depth, shape.budget))


CHAIN_SD = TreeStrategy("sd", grow=stem_growth(chain_layout), walk=walk_stems, guided=False)
