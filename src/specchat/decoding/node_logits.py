"""The target's logits at each tree node, computed from the tree pass's hidden states only
where the walk needs them: verification reads a few dozen rows of a pass over up to thousands
of nodes, and each call of the LM head reads its whole [V x H] weight."""

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.tree import DraftTree

# Target LM-head rows computed in one batch before the walk. The head reads its whole weight
# matrix (V x H) whatever the row count, so while the product is memory-bound a batch of a few
# rows costs about one row, and every node computed later costs another full read.
UPFRONT_ROWS = 8


class NodeLogits:
    """Target logits per tree node, computed on demand.

    The rows the walk will most likely visit (the draft's likeliest path, then the likeliest
    other nodes, up to UPFRONT_ROWS) are computed in one batch up front. A node asked for
    outside them means the walk left that path: it is computed with the likeliest path below it,
    where the walk most likely goes next, in one batch (one read of the head, not one per node).
    """

    def __init__(self, target: CausalLM, tree: DraftTree, hidden: torch.Tensor) -> None:
        self.target = target
        self.tree = tree
        self.hidden = hidden
        self.rows: dict[int, torch.Tensor] = {}

    def compute(self, nodes: list[int]) -> None:
        for node, row in zip(nodes, self.target.logits(self.hidden[nodes])):
            self.rows[node] = row

    def of(self, node: int) -> torch.Tensor:
        if node not in self.rows:
            below = [n for n in self.tree.likeliest_path(node) if n not in self.rows]
            self.compute(below[:UPFRONT_ROWS])
        return self.rows[node]


def upfront_nodes(tree: DraftTree, rows: int) -> list[int]:
    """The draft's likeliest path (whole, however long), then the nodes of highest cumulative
    draft log-prob not on it, up to `rows` nodes in all."""
    path = tree.likeliest_path()
    on_path = set(path)
    ranked = torch.sort(tree.logprobs, descending=True, stable=True).indices.tolist()
    return path + [node for node in ranked if node not in on_path][: max(0, rows - len(path))]
