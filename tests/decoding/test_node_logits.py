"""The target's LM-head rows a tree's walk reads: computed up front in one batch where a call's
rows cost about one, else one row at a time as the walk reaches them (decoding/head_rows.py)."""

import dataclasses

import pytest
import torch
from helpers.engines import GREEDY, SAMPLINGS, run
from helpers.trees import make_tree

from specchat.decoding import node_logits
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.head_rows import BATCH_ROWS
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine


def test_upfront_nodes_are_the_likeliest_path_then_the_likeliest_others():
    #   0 -> 1 (-0.1) -> 3 (-0.3) -> 5 (-0.9)
    #     -> 2 (-0.2) -> 4 (-0.25)
    tree = make_tree([(9, -1, 0, 0.0), (1, 0, 1, -0.1), (2, 0, 1, -0.2), (3, 1, 2, -0.3), (4, 2, 2, -0.25),
                      (5, 3, 3, -0.9)])
    assert node_logits.upfront_nodes(tree, 5) == [0, 1, 3, 5, 2]
    assert node_logits.upfront_nodes(tree, 6) == [0, 1, 3, 5, 2, 4]
    assert node_logits.upfront_nodes(tree, 2) == [0, 1, 3, 5]  # the path whole, however long


def test_upfront_nodes_take_tied_nodes_in_their_order_in_the_tree():
    """A stable sort: ties (siblings whose bf16 draft logits round alike) are taken in node order, so a
    tree's upfront rows are the same from run to run (an unstable sort reordered 100 ties here)."""
    siblings = [(2 + node, 0, 1, -1.0) for node in range(99)]
    tree = make_tree([(9, -1, 0, 0.0), (1, 0, 1, -0.5), *siblings])
    assert node_logits.upfront_nodes(tree, 10) == list(range(10))


class CountingHead:
    """A target whose LM head records the rows of each call: logits row i = [node i's id]."""

    def __init__(self, head_rows: int = BATCH_ROWS) -> None:
        self.calls: list[list[int]] = []
        self.head_rows = head_rows

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.calls.append(hidden[:, 0].long().tolist())
        return hidden


def test_a_node_off_the_upfront_rows_is_computed_with_the_likeliest_path_below_it():
    #   0 -> 1 (-0.1) -> 3 (-0.3)
    #     -> 2 (-0.2) -> 4 (-0.25) -> 5 (-0.4)
    #                 -> 6 (-0.9)
    tree = make_tree([(9, -1, 0, 0.0), (1, 0, 1, -0.1), (2, 0, 1, -0.2), (3, 1, 2, -0.3), (4, 2, 2, -0.25),
                      (5, 4, 3, -0.4), (6, 2, 2, -0.9)])
    head = CountingHead(head_rows=3)
    logits = node_logits.NodeLogits(head, tree, torch.arange(7, dtype=torch.float32).unsqueeze(1))
    logits.compute_upfront()
    assert head.calls == [[0, 1, 3]]
    assert logits.of(2).tolist() == [2.0]  # the walk left the likeliest path at the root
    assert head.calls[1] == [2, 4, 5]  # one batch: the node and the likeliest path below it
    assert logits.of(4).tolist() == [4.0] and logits.of(5).tolist() == [5.0]
    assert logits.of(6).tolist() == [6.0]
    assert head.calls[2:] == [[6]]  # nothing already computed is computed again


def test_a_row_a_call_computes_the_root_up_front_and_each_node_as_the_walk_reaches_it():
    #   0 -> 1 (-0.1) -> 3 (-0.3)
    #     -> 2 (-0.2)
    tree = make_tree([(9, -1, 0, 0.0), (1, 0, 1, -0.1), (2, 0, 1, -0.2), (3, 1, 2, -0.3)])
    assert node_logits.upfront_nodes(tree, 1) == [0]
    head = CountingHead(head_rows=1)
    logits = node_logits.NodeLogits(head, tree, torch.arange(4, dtype=torch.float32).unsqueeze(1))
    logits.compute_upfront()
    assert logits.of(0).tolist() == [0.0] and logits.of(1).tolist() == [1.0] and logits.of(1).tolist() == [1.0]
    assert head.calls == [[0], [1]]  # node 3 and node 2, never visited, never computed


def counted_rows(target):
    """`target` with its head's calls recorded: the rows of each."""
    calls: list[int] = []
    head = target.logits

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return head(hidden)

    counted = dataclasses.replace(target)
    counted.logits = logits
    return counted, calls


@pytest.mark.parametrize("sampling", [GREEDY, *SAMPLINGS], ids=["greedy", "t0.6", "t1"])
def test_specexec_with_a_row_a_call_emits_the_autoregressive_tokens_and_computes_fewer_rows(tiny_target, tiny_draft,
                                                                                         sampling):
    """The same tokens as the target alone (greedy and seeded), every head call one row, and fewer
    rows in all than the batched walk computes over the same trees."""
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    rows = {}
    for head_rows in (BATCH_ROWS, 1):
        target, calls = counted_rows(dataclasses.replace(tiny_target, head_rows=head_rows))
        tokens, events = run(TreeEngine(SPECEXEC, target, tiny_draft, [], TreeShape(budget=16, max_depth=8)), sampling)
        assert tokens == reference
        assert sum(e.accepted for e in events) > 0  # trees were drafted and accepted
        rows[head_rows] = calls
    assert set(rows[1]) == {1} and max(rows[BATCH_ROWS]) > 1
    assert sum(rows[1]) < sum(rows[BATCH_ROWS])
