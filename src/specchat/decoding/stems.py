"""Draft stems for SpecInfer (and chain SD, its one-stem case): S sequences of length L sampled
i.i.d. from the draft, their shared prefixes merged into one token tree.

The stems advance together, one position per draft forward: at each depth every stem samples
its next token from the draft's filtered distribution at the node it has reached (with its own
DRAFT uniform, see speculative_sampling.py), stems that pick the same token share the child, and
the new nodes of that depth run through the draft in one forward with a tree mask. Nodes are
created depth by depth, so parents precede children as DraftTree requires; nodes at depth L are
never run by the draft (nothing would read their logits).

Each node keeps its candidates: the child reached by every stem through it, in stem order and
with repeats, so verification sees one i.i.d. sample of q per stem, as multi-step speculative
sampling requires.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import Root
from specchat.decoding.speculative_sampling import distribution, draw_draft
from specchat.decoding.tree import GrownTree, NodeStore, TreeShape, store_tree


@dataclass(frozen=True)
class StemLayout:
    stems: int  # S
    length: int  # L: draft tokens per stem; the tree has at most S * L nodes


@dataclass(kw_only=True)
class Stems(GrownTree):
    """The merged tree with, per node, what multi-step speculative sampling reads."""

    candidates: list[list[int]]  # per node: the child each stem through it sampled, stem order
    draft_logits: dict[int, torch.Tensor]  # per node run by the draft: its next-token logits [V]


class StemGrower:
    """The merged tree while stems are being sampled, one depth at a time."""

    def __init__(self, root_token: int, root_slot: int, root_logits: torch.Tensor) -> None:
        self.store = NodeStore(root_token, root_slot)
        self.candidates: list[list[int]] = [[]]
        self.draft_logits = {0: root_logits}
        self.child_of: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    def sample_depth(self, heads: list[int], position: int, sampling: SamplingParams) -> np.ndarray:
        """Move every stem from its node in `heads` (updated in place) to a sampled child at
        absolute `position`; return the indices of the nodes this created."""
        first = self.store.count
        tokens, parents, logprobs = [], [], []
        draft_probs: dict[int, torch.Tensor] = {}
        for stem, node in enumerate(heads):
            if node not in draft_probs:
                draft_probs[node] = distribution(self.draft_logits[node], sampling, position)
            q = draft_probs[node]
            token = draw_draft(q, sampling.seed, stem, position)
            child = self.child_of.get((node, token))
            if child is None:
                child = self.child_of[(node, token)] = first + len(tokens)
                tokens.append(token)
                parents.append(node)
                logprobs.append(float(self.store.logprobs[node]) + math.log(float(q[token])))
                self.candidates.append([])
            self.candidates[node].append(child)
            heads[stem] = child
        parent_ids = np.array(parents, dtype=np.int64)
        return self.store.append(np.array(tokens, dtype=np.int64), parent_ids, self.store.depths[parent_ids] + 1,
                                 np.array(logprobs, dtype=np.float32))

    def run_draft(
        self, draft: CausalLM, cache: DynamicCache, nodes: np.ndarray, committed: int, position: int
    ) -> None:
        """One draft forward over the new `nodes` (all at `position`) with the tree mask: each
        sees the `committed` prefix, its ancestors' draft slots and itself."""
        mask = self.store.run(nodes, committed, draft.send)  # their slots follow those the draft ran
        tokens = torch.from_numpy(self.store.tokens[nodes])
        hidden = draft.hidden(tokens, torch.full((nodes.size,), position), cache, mask)
        self.draft_logits.update(zip(nodes.tolist(), draft.logits(hidden)))

    def stems(self, steps: int) -> Stems:
        store, nodes = self.store, np.arange(self.store.count)
        return Stems(tree=store_tree(store, nodes, store.parents[nodes]),
                     draft_slots=torch.from_numpy(store.slots[nodes]), steps=steps, candidates=self.candidates,
                     draft_logits=self.draft_logits)


def draft_stems(draft: CausalLM, cache: DynamicCache, root: Root, layout: StemLayout,
                sampling: SamplingParams) -> Stems:
    """Sample `layout.stems` stems of `layout.length` tokens from `root`; the draft runs every
    depth but the last (`steps` = length - 1 forwards)."""
    grower = StemGrower(root.token, root.slot, draft.logits(root.hidden)[0])
    heads = [0] * layout.stems
    for depth in range(1, layout.length + 1):
        nodes = grower.sample_depth(heads, root.position + depth, sampling)
        if depth < layout.length:
            grower.run_draft(draft, cache, nodes, root.slot + 1, root.position + depth)
    return grower.stems(steps=layout.length - 1)


Layout = Callable[[TreeShape, float], StemLayout]  # (live tree shape, temperature) -> stems


def stem_growth(layout: Layout) -> Callable[[CausalLM, DynamicCache, Root, TreeShape, SamplingParams], Stems]:
    """A strategy's grow step: stems laid out by `layout` from the tree shape of the iteration
    (live settings apply from the next one) and the temperature sampled."""
    def grow(draft: CausalLM, cache: DynamicCache, root: Root, shape: TreeShape, sampling: SamplingParams) -> Stems:
        return draft_stems(draft, cache, root, layout(shape, sampling.temperature), sampling)

    return grow
