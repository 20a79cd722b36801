"""Algorithm 2: the grown tree is exactly the top-K prefixes under the draft distribution."""

import math

import numpy as np
import pytest
import torch
from helpers.trees import path_to
from transformers import DynamicCache

from specchat import stopwatch
from specchat.decoding import specexec
from specchat.decoding.autosize import AutoSizer, Costs, Cut
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length, new_cache
from specchat.decoding.specexec import add_children, catch_up, grow, pick_expansion
from specchat.decoding.tree import GrownTree, NodeStore, TreeShape

PROMPT = [3, 1, 4, 1, 5]


def grow_after_prompt(draft: CausalLM, shape: TreeShape, temperature: float,
                      cache: DynamicCache | None = None) -> GrownTree:
    """The tree after PROMPT, from an empty draft cache (pass `cache` to inspect it)."""
    cache = new_cache() if cache is None else cache
    root = catch_up(draft, cache, torch.tensor(PROMPT), 0)
    return grow(draft, cache, root, shape, SamplingParams(temperature=temperature))


def next_logprobs(model: CausalLM, prefix: list[int], temperature: float) -> torch.Tensor:
    """Sequential (no cache reuse, no tree mask) draft log-probs after `prefix`."""
    hidden = model.hidden(torch.tensor(prefix), torch.arange(len(prefix)), new_cache())
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(model.logits(hidden[-1:])[0] / scale, dim=-1)


def brute_force_top_k(model: CausalLM, shape: TreeShape, temperature: float) -> dict[tuple, float]:
    """Enumerate every prefix reachable through each node's `max_children` best children."""
    frontier = {(): 0.0}
    nodes: dict[tuple, float] = {}
    for _ in range(shape.max_depth):
        grown = {}
        for path, logprob in frontier.items():
            top = next_logprobs(model, PROMPT + list(path), temperature).topk(shape.max_children)
            for value, token in zip(top.values.tolist(), top.indices.tolist()):
                grown[path + (token,)] = logprob + value
        nodes.update(grown)
        frontier = grown
    best = sorted(nodes.items(), key=lambda item: (-item[1], len(item[0])))[: shape.budget]
    return dict(best)


def tree_paths(tree) -> dict[tuple, float]:
    tokens = tree.tokens.tolist()
    return {
        tuple(tokens[i] for i in path_to(tree, node)[1:]): float(tree.logprobs[node])
        for node in range(1, tree.tokens.numel())
    }


@pytest.mark.parametrize(
    "shape,temperature",
    [
        (TreeShape(budget=12, max_depth=3, batch=2, max_children=4), 0.0),
        (TreeShape(budget=30, max_depth=4, batch=5, max_children=3), 0.6),
        (TreeShape(budget=7, max_depth=5, batch=16, max_children=2), 1.0),
    ],
)
def test_tree_is_brute_force_top_k(tiny_draft, shape, temperature):
    grown = grow_after_prompt(tiny_draft, shape, temperature)
    expected = brute_force_top_k(tiny_draft, shape, temperature)
    got = tree_paths(grown.tree)
    assert set(got) == set(expected)
    assert max(grown.widths) <= shape.expansion_batch  # a step expands at most B nodes
    for path, logprob in expected.items():
        assert got[path] == pytest.approx(logprob, abs=1e-5)


def test_tree_is_topologically_ordered_and_cache_consistent(tiny_draft):
    shape = TreeShape(budget=40, max_depth=6, batch=8, max_children=4)
    cache = new_cache()
    grown = grow_after_prompt(tiny_draft, shape, 0.6, cache)
    tree = grown.tree
    assert tree.size == 40
    parents = tree.parents.tolist()
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i > 0)
    assert all(tree.depths[i] == tree.depths[p] + 1 for i, p in enumerate(parents) if i > 0)
    assert tree.depth <= shape.max_depth
    # every node the draft ran has a distinct slot beyond the committed prompt
    slots = grown.draft_slots[1:]
    ran = slots[slots >= 0]
    assert ran.unique().numel() == ran.numel() and bool((ran >= len(PROMPT)).all())
    assert cache_length(cache) >= int(ran.max()) + 1
    assert grown.draft_slots[0] == len(PROMPT) - 1


def test_all_children_distinct(tiny_draft):
    grown = grow_after_prompt(tiny_draft, TreeShape(budget=64, max_depth=5), 1.0)
    pairs = list(zip(grown.tree.parents.tolist(), grown.tree.tokens.tolist()))[1:]
    assert len(set(pairs)) == len(pairs)


def test_ancestor_mask_matches_paths(tiny_draft):
    grown = grow_after_prompt(tiny_draft, TreeShape(budget=25, max_depth=4, batch=4), 0.6)
    mask = grown.tree.ancestor_mask()
    for node in range(grown.tree.tokens.numel()):
        expected = torch.zeros_like(mask[node])
        expected[path_to(grown.tree, node)] = True
        assert torch.equal(mask[node], expected)


@pytest.mark.parametrize("budget,depth", [(64, 6), (200, 12), (33, 24)])
def test_a_ranked_tree_fills_its_budget_and_depth_whatever_the_draft(tiny_draft, budget, depth):
    """gpu_check --pair's trees: scored by rank, the first children's chain reaches max_depth in
    max_depth - 1 expansions after the root's, and the tree holds the whole budget, the first
    children's path included; the draft's own (flat, random) trees stop shallower."""
    shape = TreeShape(budget=budget, max_depth=depth, ranked_tree=True)
    grown = grow_after_prompt(tiny_draft, shape, 0.6)
    assert grown.tree.tokens.numel() - 1 == budget
    assert int(grown.tree.depths.max()) == depth and grown.steps == depth - 1
    first = next_logprobs(tiny_draft, PROMPT, 0.6).argmax().item()
    assert first in grown.tree.tokens[grown.tree.depths == 1].tolist()
    drafted = grow_after_prompt(tiny_draft, TreeShape(budget=budget, max_depth=depth), 0.6)
    assert int(drafted.tree.depths.max()) < depth


def test_the_trees_bookkeeping_is_the_time_outside_the_drafts_steps(tiny_draft, monkeypatch):
    """A stand-in clock: each of the draft's forwards and top children takes 1 s, each offer of
    children to the tree 1 ms; the tree's host_s counts the offers alone."""
    clock, offers = [0.0], []
    monkeypatch.setattr(specexec, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(stopwatch, "perf_counter", lambda: clock[0])

    def slow(method):
        def run(*args, **kwargs):
            clock[0] += 1.0
            return method(*args, **kwargs)
        return run

    def offer(*args):
        offers.append(1)
        clock[0] += 1e-3
        return add_children(*args)

    monkeypatch.setattr(tiny_draft, "hidden", slow(tiny_draft.hidden))
    monkeypatch.setattr(tiny_draft, "top_logprobs", slow(tiny_draft.top_logprobs))
    monkeypatch.setattr(specexec, "add_children", offer)
    grown = grow_after_prompt(tiny_draft, TreeShape(budget=24, max_depth=4, batch=4), 0.6)
    assert len(offers) == grown.steps + 1  # the root's children, then one offer a step
    assert grown.host_s == pytest.approx(len(offers) * 1e-3)


def test_a_draft_with_a_capacity_grows_no_further_than_its_slots(tiny_draft):
    """An eager draft's cache holds what the memory plan counts (loader: the context and the
    largest tree): growth runs more rows than it keeps, and stops where the slots end; the tree
    still fills its budget from the children it has."""
    shape = TreeShape(budget=64, max_depth=8, batch=8)
    unbounded_cache, bounded_cache = new_cache(), new_cache()
    unbounded = grow_after_prompt(tiny_draft, shape, 0.0, unbounded_cache)
    bounded = grow_after_prompt(CausalLM(tiny_draft.model, capacity=len(PROMPT) + 20), shape, 0.0, bounded_cache)
    assert sum(unbounded.widths) > 20 == sum(bounded.widths) == cache_length(bounded_cache) - len(PROMPT)
    assert cache_length(unbounded_cache) - len(PROMPT) == sum(unbounded.widths)
    assert bounded.tree.size == 64


def test_children_the_draft_cannot_give_never_join_the_tree():
    """A child of log-prob -inf (one the guide forbids, or past the draft's sub-vocabulary) is
    left out, even where the budget has room for it."""
    store = NodeStore(0, 0)
    top = (torch.tensor([[-0.1, -0.7, -math.inf]]), torch.tensor([[5, 6, 7]]))
    add_children(store, np.array([0]), top, TreeShape(budget=8, max_children=3))
    assert sorted(store.tokens[store.kept].tolist()) == [5, 6]


class TwoAStep(AutoSizer):
    """A sizer that expands `width` open nodes a step for four steps, then stops growth, and
    records the draft seconds it was told of and the probabilities it widened and cut from."""

    def __init__(self, width: int = 2) -> None:
        super().__init__(Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(0.01, 0.03)), 32,
                         learns_costs=False)
        self.told: list[float] = []
        self.width = width
        self.cut_from: list[torch.Tensor] = []
        self.widened_from: list[tuple[torch.Tensor, torch.Tensor]] = []

    def best_cut(self, probs: torch.Tensor, draft_spent: float) -> Cut:
        self.cut_from.append(probs)
        return super().best_cut(probs, draft_spent)

    def step_width(self, open_probs: torch.Tensor, probs: torch.Tensor, draft_spent: float) -> int:
        self.told.append(draft_spent)
        self.widened_from.append((open_probs, probs))
        return self.width if len(self.told) < 5 else 0


def test_under_budget_auto_each_step_is_as_wide_as_the_sizer_says_and_it_hears_what_drafting_cost(tiny_draft):
    """The sizer decides each step's width from the draft seconds spent so far: the root's step,
    then each step's at its width."""
    sizer = TwoAStep()
    grown = grow_after_prompt(tiny_draft, TreeShape(budget=32, max_depth=6, sizer=sizer), 0.6)
    assert grown.widths == (2, 2, 2, 2)
    spent = [sizer.draft_s(1)]
    for width in grown.widths:
        spent.append(spent[-1] + sizer.draft_s(width))
    assert sizer.told == pytest.approx(spent)
    final = sizer.cut_from[-1]  # the tree is cut from its likeliest nodes down
    assert final.numel() > 8 and torch.equal(final, final.sort(descending=True).values)
    for open_probs, probs in sizer.widened_from[1:]:  # and each step weighs them likeliest first
        assert probs.numel() > 1 and torch.equal(probs, probs.sort(descending=True).values)
        assert torch.equal(open_probs, open_probs.sort(descending=True).values)


def test_under_budget_auto_the_sizer_stops_growth_with_one_node_open_too(tiny_draft):
    """A chain (one child a node): each step has one open node, and the sizer still decides."""
    grown = grow_after_prompt(tiny_draft, TreeShape(budget=32, max_depth=8, max_children=1, sizer=TwoAStep(1)), 0.6)
    assert grown.widths == (1, 1, 1, 1)


def test_a_full_tree_expands_no_node_at_or_below_its_kth_best_log_prob():
    """T, the K-th best log-prob: an open node at T could only add children below it."""
    store = NodeStore(0, 0)
    store.append(np.array([4, 5]), np.array([0, 0]), np.array([1, 1]), np.array([-0.5, -0.9]))
    store.kept = np.array([1, 2])
    store.slots[1] = 3  # node 1 ran; node 2, the K-th best, is the only open one
    assert pick_expansion(store, TreeShape(budget=2, max_depth=4)).size == 0
    assert pick_expansion(store, TreeShape(budget=3, max_depth=4)).tolist() == [2]  # room left: it may
