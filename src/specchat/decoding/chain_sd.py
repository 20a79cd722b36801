"""Chain speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

The draft samples one chain of k = min(K, D) tokens, one target pass scores it, and each token
is accepted with probability min(1, p / q); the first rejection emits a sample of the residual
norm(max(p - q, 0)), a fully accepted chain a bonus token from p. That is SpecInfer's multi-step
speculative sampling with a single stem (one candidate per node), so the engine is SpecInfer's
strategy with a one-stem layout; the math lives in speculative_sampling.py.
"""

from collections.abc import Collection

from specchat.decoding.drafter import TreeShape
from specchat.decoding.forward import CausalLM
from specchat.decoding.specinfer import SpecInferStrategy
from specchat.decoding.stems import StemLayout
from specchat.decoding.tree_engine import TreeEngine


def chain_layout(shape: TreeShape, temperature: float) -> StemLayout:
    """One stem: the whole budget, capped by the maximum depth (at any temperature)."""
    return StemLayout(stems=1, length=min(shape.max_depth, shape.budget))


def ChainSDEngine(target: CausalLM, draft: CausalLM, stop_ids: Collection[int], shape: TreeShape) -> TreeEngine:
    """The chain SD engine: a `TreeEngine` with SpecInfer's strategy over one stem."""
    return TreeEngine("sd", SpecInferStrategy(chain_layout), target, draft, stop_ids, shape)
