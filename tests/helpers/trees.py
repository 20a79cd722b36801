"""Draft trees written out by hand (a fixed seven-node tree, the tree fixture) and the path from
the root to a node."""

import pytest
import torch

from specchat.decoding.tree import DraftTree


def make_tree(rows: list[tuple[int, int, int, float]]) -> DraftTree:
    """rows: (token, parent, depth, cumulative logprob) per node, root first."""
    tokens, parents, depths, logprobs = zip(*rows)
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        logprobs=torch.tensor(logprobs, dtype=torch.float32),
    )


def path_to(tree: DraftTree, node: int) -> list[int]:
    """Node indices from the root down to `node`, inclusive."""
    path = []
    parents = tree.parents.tolist()
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


#       0 (10)
#      /      \
#   1 (11)    2 (12)
#   /    \       \
# 3 (13) 4 (14)  5 (13)   <- token 13 under two different parents
#          |
#        6 (16)
ROWS = [
    (10, -1, 0, 0.0),
    (11, 0, 1, -0.5),
    (12, 0, 1, -1.0),
    (13, 1, 2, -1.5),
    (14, 1, 2, -0.9),
    (13, 2, 2, -1.2),
    (16, 4, 3, -2.0),
]


@pytest.fixture
def tree() -> DraftTree:
    return make_tree(ROWS)
