"""SpecExec (Svirschevski et al. 2024): draft the K likeliest continuations as a token tree
(Algorithm 2, drafter.py), score it with one target pass, and walk it by sampling the target at
each node (Algorithm 1, verifier.py). The loop and cache handling are `TreeEngine`'s."""

from collections.abc import Callable, Collection

import torch
from transformers import DynamicCache

from specchat.decoding.autosize import AutoSizer
from specchat.decoding.drafter import GrownTree, Root, TreeShape, grow_tree
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.tree_engine import TreeEngine
from specchat.decoding.verifier import Verdict, verify


class SpecExecStrategy:
    """A top-K tree (shaped by the temperature actually sampled) and Algorithm 1."""

    guided = True  # verification samples through emit_token; the tree grows through allowed tokens

    def draft(self, draft: CausalLM, cache: DynamicCache, root: Root, shape: TreeShape,
              sampling: SamplingParams) -> GrownTree:
        return grow_tree(draft, cache, root, shape, sampling.temperature, sampling.guide)

    def walk(self, drafted: GrownTree, node_logits: Callable[[int], torch.Tensor], sampling: SamplingParams,
             first_position: int, max_tokens: int, stop_ids: Collection[int]) -> Verdict:
        return verify(drafted.tree, node_logits, sampling, first_position, max_tokens, stop_ids)


def SpecExecEngine(target: CausalLM, draft: CausalLM, stop_ids: Collection[int], shape: TreeShape,
                   sizer: AutoSizer | None = None) -> TreeEngine:
    """The SpecExec engine: a `TreeEngine` with this strategy; with a `sizer` it can size its
    trees itself (--budget auto)."""
    return TreeEngine("specexec", SpecExecStrategy(), target, draft, stop_ids, shape, sizer)
