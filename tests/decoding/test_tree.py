"""DraftTree: children table, paths, likeliest path, ancestor masks, size and depth."""

import numpy as np
import pytest
import torch
from helpers.trees import ROWS, make_tree, path_to, tree

from specchat.decoding.tree import DraftTree, NodeStore, TreeShape, ancestor_mask, node_paths, rank


def test_children_are_keyed_by_token_per_parent(tree: DraftTree) -> None:
    assert tree.children == [{11: 1, 12: 2}, {13: 3, 14: 4}, {13: 5}, {}, {16: 6}, {}, {}]


@pytest.mark.parametrize(
    ("node", "expected"), [(0, [0]), (1, [0, 1]), (3, [0, 1, 3]), (5, [0, 2, 5]), (6, [0, 1, 4, 6])]
)
def test_path_to(tree: DraftTree, node: int, expected: list[int]) -> None:
    assert path_to(tree, node) == expected


def test_likeliest_path_steps_to_best_child_at_each_level(tree: DraftTree) -> None:
    # At node 1 the better child (4) is the later one, so "first child" would be wrong.
    assert tree.likeliest_path() == [0, 1, 4, 6]


def test_likeliest_path_is_greedy_not_global() -> None:
    """The documented rule is a local step to the best child, not the best leaf overall."""
    tree = make_tree([
        (0, -1, 0, 0.0),
        (1, 0, 1, -0.1),  # best child of the root, but its only leaf is poor
        (2, 0, 1, -0.2),
        (3, 1, 2, -5.0),
        (4, 2, 2, -0.3),  # best leaf overall
    ])
    assert tree.likeliest_path() == [0, 1, 3]


def test_likeliest_path_from_a_node_goes_down_its_own_subtree(tree: DraftTree) -> None:
    assert tree.likeliest_path(2) == [2, 5]
    assert tree.likeliest_path(4) == [4, 6]
    assert tree.likeliest_path(3) == [3]


def test_likeliest_path_of_root_only_tree() -> None:
    assert make_tree([(5, -1, 0, 0.0)]).likeliest_path() == [0]


def test_size_excludes_root_and_depth_is_max_depth(tree: DraftTree) -> None:
    assert tree.size == 6
    assert tree.depth == 3
    root_only = make_tree([(5, -1, 0, 0.0)])
    assert root_only.size == 0
    assert root_only.depth == 0


def test_ancestor_mask_matches_paths(tree: DraftTree) -> None:
    mask = tree.ancestor_mask()
    n = len(ROWS)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    expected = torch.zeros(n, n, dtype=torch.bool)
    for node in range(n):
        expected[node, path_to(tree, node)] = True
    assert torch.equal(mask, expected)
    assert mask[6].nonzero().flatten().tolist() == [0, 1, 4, 6]
    assert not mask[6, 2] and not mask[6, 3] and not mask[4, 3]  # siblings and cousins hidden


def test_free_ancestor_mask_with_several_roots() -> None:
    # Two roots (0 and 2); node 4 sits two levels below root 2.
    parents = torch.tensor([-1, 0, -1, 2, 3, 0])
    expected_rows = {0: [0], 1: [0, 1], 2: [2], 3: [2, 3], 4: [2, 3, 4], 5: [0, 5]}
    for max_depth in (2, 10):  # extra levels past every root change nothing
        mask = ancestor_mask(parents, max_depth)
        assert {i: mask[i].nonzero().flatten().tolist() for i in range(6)} == expected_rows


def test_free_ancestor_mask_walks_only_max_depth_levels() -> None:
    parents = torch.tensor([-1, 0, 1, 2])
    assert torch.equal(ancestor_mask(parents, 0), torch.eye(4, dtype=torch.bool))
    one_level = ancestor_mask(parents, 1)
    assert one_level[3].nonzero().flatten().tolist() == [2, 3]
    assert torch.equal(ancestor_mask(parents, 3), torch.ones(4, 4, dtype=torch.bool).tril())


def reference_rank(logprobs: torch.Tensor, depths: torch.Tensor) -> list[int]:
    """Log-prob descending, then depth ascending, then index: Python's sort of the tuples."""
    return sorted(range(logprobs.numel()), key=lambda i: (-float(logprobs[i]), int(depths[i]), i))


@pytest.mark.parametrize("seed", range(5))
def test_rank_orders_by_logprob_then_depth_then_index(seed: int) -> None:
    """Ties are the rule in a ranked tree (scores -1, -2, ... added up): drawn from a few values,
    with -0.0 beside 0.0 and the extremes of float32."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.tensor([0.0, -0.0, -1.0, -2.0, -1.5, -1e-30, -3.4e38, 1e-30, -7.25])
    logprobs = values[torch.randint(0, values.numel(), (400,), generator=generator)]
    depths = torch.randint(0, 256, (400,), generator=generator)
    assert rank(logprobs.numpy(), depths.numpy()).tolist() == reference_rank(logprobs, depths)


def test_rank_refuses_float64_log_probs() -> None:
    with pytest.raises(TypeError, match="float32"):
        rank(np.zeros(3, dtype=np.float64), np.zeros(3, dtype=np.int64))


def walked_mask(store: NodeStore, nodes: np.ndarray, committed: int, cached: int) -> torch.Tensor:
    """What a step over `nodes` may see, by walking each node up to the root: the committed prefix,
    its ancestors' draft slots and its own (the next `nodes.size` slots, in order)."""
    mask = torch.zeros(nodes.size, cached + nodes.size, dtype=torch.bool)
    mask[:, :committed] = True
    for row, node in enumerate(nodes.tolist()):
        mask[row, cached + row] = True
        parent = int(store.parents[node])
        while parent > 0:
            mask[row, int(store.slots[parent])] = True
            parent = int(store.parents[parent])
    return mask


@pytest.mark.parametrize("seed", range(3))
def test_a_steps_mask_is_what_walking_up_the_ancestors_sees(seed: int) -> None:
    """Random trees grown a level at a time, each level run in a random order with some nodes
    never run: every step's mask and slots are the walked ones."""
    generator = np.random.default_rng(seed)
    committed = 7
    store, frontier = NodeStore(root_token=5, root_slot=committed - 1), np.zeros(1, dtype=np.int64)
    for _ in range(6):
        parents = np.repeat(frontier, 3)
        count = parents.size
        nodes = store.append(generator.integers(0, 100, count), parents, store.depths[parents] + 1,
                             -generator.random(count, dtype=np.float32))
        nodes = nodes[generator.permutation(count)][: max(1, count // 2)]  # the rest never run
        cached = committed + store.ran
        expected = walked_mask(store, nodes, committed, cached)
        assert torch.equal(store.run(nodes, committed, lambda host: host), expected)
        assert store.slots[nodes].tolist() == list(range(cached, cached + nodes.size))
        frontier = nodes


@pytest.mark.parametrize(("budget", "batch"), [(8, 16), (128, 16), (256, 32), (1024, 128), (2048, 256)])
def test_a_fixed_budget_expands_an_eighth_of_it_a_step_and_16_nodes_at_least(budget: int, batch: int) -> None:
    assert TreeShape(budget).expansion_batch == batch
    assert TreeShape(budget, batch=5).expansion_batch == 5  # as asked


def test_node_paths_are_each_nodes_tokens_below_the_root_its_first_child_first():
    """What a guide consumes to reach a node (specexec.grow): the root's own token is not in it."""
    store = NodeStore(9, 0)
    store.append(np.array([4, 5, 6, 7]), np.array([0, 1, 0, 2]), np.array([1, 2, 1, 3]), np.zeros(4))
    assert node_paths(store, np.array([0, 1, 2, 3, 4])) == [[], [4], [4, 5], [6], [4, 5, 7]]
