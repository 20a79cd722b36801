"""Algorithm 1 (tree verification) on hand-built trees and fake target logits."""

import zlib
from collections.abc import Callable

import pytest
import torch
from helpers.trees import path_to

from specchat.decoding.events import SamplingParams
from specchat.decoding.sampling import sample_token
from specchat.decoding.specexec import Verdict, walk
from specchat.decoding.tree import DraftTree, GrownTree

VOCAB = 8
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, seed=0)

#        0 (root, token 7)
#       /        \
#    1 (1)       2 (2)
#    /   \         \
#  3 (3) 4 (4)     6 (2)
#   |
#  5 (5)
ROWS = [(7, -1, 0), (1, 0, 1), (2, 0, 1), (3, 1, 2), (4, 1, 2), (5, 3, 3), (2, 2, 2)]


def make_tree(rows: list[tuple[int, int, int]]) -> DraftTree:
    tokens, parents, depths = zip(*rows)
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        logprobs=-torch.tensor(depths, dtype=torch.float32),
    )


def verify(tree: DraftTree, *args, **kwargs) -> Verdict:
    """SpecExec's walk (Algorithm 1) down a hand-built tree, one the draft never ran."""
    return walk(GrownTree(tree, draft_slots=torch.full_like(tree.tokens, -1), steps=0), *args, **kwargs)


@pytest.fixture
def tree() -> DraftTree:
    return make_tree(ROWS)


class ArgmaxLogits:
    """node_logits whose argmax at each node is chosen by the test; records the nodes asked."""

    def __init__(self, choice: dict[int, int]) -> None:
        self.choice = choice
        self.calls: list[int] = []

    def __call__(self, node: int) -> torch.Tensor:
        self.calls.append(node)
        logits = torch.zeros(VOCAB)
        logits[self.choice[node]] = 5.0
        return logits


def run_greedy(
    tree: DraftTree, choice: dict[int, int], max_tokens: int = 100, stop_ids: frozenset[int] = frozenset()
) -> tuple[Verdict, list[int]]:
    logits = ArgmaxLogits(choice)
    verdict = verify(tree, logits, GREEDY, first_position=10, max_tokens=max_tokens, stop_ids=stop_ids)
    return verdict, logits.calls


def assert_consistent(tree: DraftTree, verdict: Verdict) -> None:
    """The engine relies on: one committed KV slot per emitted token, on a root-down chain
    whose drafted tokens are the emitted ones."""
    assert len(verdict.path) == len(verdict.tokens)
    assert verdict.path == path_to(tree, verdict.path[-1])
    assert tree.tokens[verdict.path[1:]].tolist() == verdict.tokens[: len(verdict.path) - 1]


def test_greedy_follows_argmax_children_and_emits_target_token_on_miss(tree: DraftTree) -> None:
    verdict, calls = run_greedy(tree, {0: 1, 1: 4, 4: 6})
    assert verdict == Verdict(path=[0, 1, 4], tokens=[1, 4, 6], accepted=2, stopped=False)
    assert calls == [0, 1, 4]  # only nodes on the walk are scored
    assert_consistent(tree, verdict)


def test_greedy_stops_at_first_miss_even_if_token_exists_deeper(tree: DraftTree) -> None:
    # Token 3 is in the tree, but only under node 1: at node 2 it is a miss.
    verdict, calls = run_greedy(tree, {0: 2, 2: 3})
    assert verdict == Verdict(path=[0, 2], tokens=[2, 3], accepted=1, stopped=False)
    assert calls == [0, 2]


def test_greedy_miss_at_root(tree: DraftTree) -> None:
    verdict, calls = run_greedy(tree, {0: 6})
    assert verdict == Verdict(path=[0], tokens=[6], accepted=0, stopped=False)
    assert calls == [0]


def test_greedy_walks_to_a_leaf_then_emits_bonus_token(tree: DraftTree) -> None:
    verdict, _ = run_greedy(tree, {0: 1, 1: 3, 3: 5, 5: 0})
    assert verdict == Verdict(path=[0, 1, 3, 5], tokens=[1, 3, 5, 0], accepted=3, stopped=False)
    assert_consistent(tree, verdict)


def test_stop_token_that_is_a_tree_child_ends_the_walk(tree: DraftTree) -> None:
    # Node 3 has a child, so walking on would emit more; a stop token must end it.
    verdict, calls = run_greedy(tree, {0: 1, 1: 3, 3: 5}, stop_ids=frozenset({3}))
    assert verdict == Verdict(path=[0, 1], tokens=[1, 3], accepted=2, stopped=True)
    assert calls == [0, 1]
    assert_consistent(tree, verdict)


def test_stop_token_on_a_miss(tree: DraftTree) -> None:
    verdict, _ = run_greedy(tree, {0: 1, 1: 6}, stop_ids=frozenset({6, 0}))
    assert verdict == Verdict(path=[0, 1], tokens=[1, 6], accepted=1, stopped=True)


@pytest.mark.parametrize(
    ("max_tokens", "path", "tokens"),
    [(1, [0], [1]), (2, [0, 1], [1, 3]), (3, [0, 1, 3], [1, 3, 5]), (4, [0, 1, 3, 5], [1, 3, 5, 0])],
)
def test_max_tokens_limits_emission(tree: DraftTree, max_tokens: int, path: list[int], tokens: list[int]) -> None:
    verdict, calls = run_greedy(tree, {0: 1, 1: 3, 3: 5, 5: 0}, max_tokens=max_tokens)
    assert verdict.tokens == tokens
    assert verdict.path == path
    assert verdict.stopped is False
    assert calls == path
    assert_consistent(tree, verdict)


def test_greedy_tie_takes_first_maximum(tree: DraftTree) -> None:
    verdict = verify(tree, lambda node: torch.zeros(VOCAB), GREEDY, 0, 100, frozenset())
    assert verdict.tokens == [0]


# --- sampled runs: lossless against sequential sampling ------------------------------------------

SAMPLED_VOCAB = 5
BRANCHING = 3  # tokens 0..2 are drafted at every node; 3 and 4 are always misses


def full_tree(depth: int) -> DraftTree:
    """Every node at depth < `depth` has children for tokens 0..BRANCHING-1 (breadth first)."""
    rows, frontier = [(SAMPLED_VOCAB - 1, -1, 0)], [0]
    for level in range(1, depth + 1):
        next_frontier = []
        for parent in frontier:
            for token in range(BRANCHING):
                next_frontier.append(len(rows))
                rows.append((token, parent, level))
        frontier = next_frontier
    return make_tree(rows)


def target_logits(prefix: tuple[int, ...]) -> torch.Tensor:
    """A fixed random 'target model': logits depend only on the tokens emitted so far."""
    generator = torch.Generator().manual_seed(zlib.crc32(bytes(prefix)))
    return torch.randn(SAMPLED_VOCAB, generator=generator, dtype=torch.float64) * 1.5


def tree_logits(tree: DraftTree) -> Callable[[int], torch.Tensor]:
    return lambda node: target_logits(tuple(tree.tokens[path_to(tree, node)[1:]].tolist()))


def sequential(
    params: SamplingParams, first_position: int, max_tokens: int, stop_ids: frozenset[int]
) -> list[int]:
    """Plain autoregressive sampling, one sample_token call per absolute position."""
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        token = sample_token(target_logits(tuple(tokens)), params, first_position + len(tokens))
        tokens.append(token)
        if token in stop_ids:
            break
    return tokens


def test_sampled_run_emits_sequential_tokens_at_absolute_positions() -> None:
    tree = full_tree(3)
    node_logits = tree_logits(tree)
    accepted_total, lengths = 0, set()
    for seed in range(40):
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        first_position = 17 + seed
        verdict = verify(tree, node_logits, params, first_position, max_tokens=100, stop_ids=frozenset())
        expected = sequential(params, first_position, len(verdict.tokens), frozenset())
        assert verdict.tokens == expected, seed
        assert verdict.accepted == len(verdict.tokens) - 1  # ended by a miss
        assert_consistent(tree, verdict)
        accepted_total += verdict.accepted
        lengths.add(len(verdict.tokens))
    # The check is only meaningful if walks go deep and end at different depths.
    assert accepted_total > 20 and len(lengths) >= 3


def test_sampled_run_depends_on_first_position() -> None:
    """Guards the test above: a verifier counting positions from 0 would emit other tokens."""
    tree = full_tree(3)
    node_logits = tree_logits(tree)
    differs = 0
    for seed in range(40):
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        at_17 = verify(tree, node_logits, params, 17, 100, frozenset()).tokens
        differs += at_17 != sequential(params, 0, len(at_17), frozenset())
    assert differs > 10


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_sampled_run_with_stop_ids_and_limit(max_tokens: int) -> None:
    tree = full_tree(4)
    node_logits = tree_logits(tree)
    stop_ids = frozenset({1})  # a drafted token: stops can happen inside the tree
    stopped_inside = 0
    for seed in range(30):
        params = SamplingParams(temperature=1.0, top_p=1.0, seed=seed)
        verdict = verify(tree, node_logits, params, 5, max_tokens, stop_ids)
        expected = sequential(params, 5, max_tokens, stop_ids)
        assert verdict.tokens == expected[: len(verdict.tokens)]
        assert len(verdict.tokens) <= max_tokens
        assert verdict.stopped == (verdict.tokens[-1] in stop_ids)
        assert not any(token in stop_ids for token in verdict.tokens[:-1])
        if not verdict.stopped and len(verdict.tokens) < max_tokens:
            assert verdict.tokens[-1] >= BRANCHING  # only a miss ends a walk early
        assert_consistent(tree, verdict)
        stopped_inside += verdict.stopped and verdict.accepted == len(verdict.tokens)
    if max_tokens > 1:
        assert stopped_inside > 0
