"""The target's logits at each tree node, computed from the tree pass's hidden states only
where the walk needs them: verification reads a few dozen rows of a pass over up to thousands
of nodes, and each call of the LM head reads its whole [V x H] weight."""

from itertools import islice

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.tree import DraftTree


class NodeLogits:
    """Target logits per tree node, computed on demand, in calls of the target's `head_rows`
    (decoding/head_rows.py).

    Where a call's rows cost about one (a memory-bound head), the rows the walk will most likely
    visit (the draft's likeliest path, then the likeliest other nodes, up to `head_rows`) are
    computed in one batch up front. A node asked for outside them means the walk left that path:
    it is computed with the likeliest path below it, where the walk most likely goes next, in one
    batch (one read of the head, not one per node). Where each row costs a call (`head_rows` 1),
    the root alone is computed up front and every other node as the walk reaches it.
    """

    def __init__(self, target: CausalLM, tree: DraftTree, hidden: torch.Tensor) -> None:
        self.target = target
        self.tree = tree
        self.hidden = hidden
        self.rows: dict[int, torch.Tensor] = {}

    def compute(self, nodes: list[int]) -> None:
        for node, row in zip(nodes, self.target.logits(self.hidden[nodes])):
            self.rows[node] = row

    def compute_upfront(self) -> None:
        """The rows the walk will most likely visit, in one call (`upfront_nodes`)."""
        self.compute(upfront_nodes(self.tree, self.target.head_rows))

    def of(self, node: int) -> torch.Tensor:
        if node not in self.rows:
            below = (n for n in self.tree.descend_likeliest(node) if n not in self.rows)
            self.compute(list(islice(below, self.target.head_rows)))
        return self.rows[node]


def upfront_nodes(tree: DraftTree, rows: int) -> list[int]:
    """The draft's likeliest path (whole, however long), then the nodes of highest cumulative
    draft log-prob not on it, up to `rows` nodes in all; the root alone where a call holds one row
    (each row costs a call: the walk computes the rest as it visits them)."""
    if rows == 1:
        return [0]
    path = tree.likeliest_path()
    on_path = set(path)
    ranked = torch.sort(tree.logprobs, descending=True, stable=True).indices.tolist()
    return path + [node for node in ranked if node not in on_path][: max(0, rows - len(path))]
