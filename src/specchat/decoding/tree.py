"""The draft tree as flat tensors.

Node 0 is the root: the last committed token, whose children are candidates for the next
position. Parents always precede their children, so a node's index is also its slot in the
target's KV cache during the tree pass, and masks and pruning are index operations.
"""

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [n] int64 token ids
    parents: torch.Tensor  # [n] int64 parent index, -1 for the root
    depths: torch.Tensor  # [n] int64, root = 0
    logprobs: torch.Tensor  # [n] float32 cumulative draft log-probability, root = 0

    @property
    def size(self) -> int:
        """Number of draft tokens (the root is committed, not drafted)."""
        return self.tokens.numel() - 1

    @property
    def depth(self) -> int:
        return int(self.depths.max())

    def ancestor_mask(self) -> torch.Tensor:
        """bool [n, n]: entry (i, j) is True when j is i itself or one of its ancestors."""
        return ancestor_mask(self.parents, self.depth)

    @cached_property
    def children(self) -> list[dict[int, int]]:
        """For each node, its children keyed by token id."""
        table: list[dict[int, int]] = [{} for _ in range(self.tokens.numel())]
        for child, (parent, token) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            if parent >= 0:
                table[parent][token] = child
        return table

    def likeliest_path(self, start: int = 0) -> list[int]:
        """From `start` (the root by default), repeatedly step to the child with the highest draft
        log-prob."""
        path, node = [start], start
        while self.children[node]:
            node = max(self.children[node].values(), key=lambda child: float(self.logprobs[child]))
            path.append(node)
        return path


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Ancestor-or-self matrix by walking every node up `max_depth` levels at once.

    Parents must be -1 for roots; walking stops at the root for each row.
    """
    n = parents.numel()
    rows = torch.arange(n)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[rows, rows] = True
    current = parents.clone()
    for _ in range(max_depth):
        alive = current >= 0
        if not alive.any():
            break
        mask[rows[alive], current[alive]] = True
        current[alive] = parents[current[alive]]
    return mask
