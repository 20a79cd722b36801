"""SpecInfer on tiny models: the stem layout and tree, greedy exactness, seeded reproducibility,
the sampled distribution (chi-square), cache consistency, limits (its greedy exactness on the real
pair is in test_real_exactness.py). The engine-independent checks come from test_sd.py."""

import pytest
from helpers.engines import (PROMPT, SAMPLINGS, assert_follows_target, assert_greedy_equals_autoregressive,
                             assert_reproducible, assert_stops_at_stop_token, assert_token_limit, run)

from specchat.decoding.events import LiveSettings
from specchat.decoding.specinfer import SPECINFER, specinfer_layout
from specchat.decoding.stems import StemLayout
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)


def specinfer(target, draft):
    return lambda stop_ids, shape: TreeEngine(SPECINFER, target, draft, stop_ids, shape)


@pytest.mark.parametrize(
    "budget,depth,stems,length",
    [(1, 24, 1, 1), (3, 24, 3, 1), (4, 24, 2, 2), (10, 24, 3, 3), (16, 24, 4, 4), (64, 24, 8, 8),
     (64, 4, 16, 4), (1024, 24, 42, 24)],
)
def test_layout_splits_the_budget_into_square_ish_stems(budget, depth, stems, length):
    assert specinfer_layout(TreeShape(budget, depth), 0.6) == StemLayout(stems, length)
    assert stems * length <= budget
    assert specinfer_layout(TreeShape(budget, depth), 0.0) == StemLayout(1, min(budget, depth))  # greedy: one chain


@pytest.mark.parametrize("budget,depth", [(1, 1), (4, 24), (16, 8), (40, 12)])
def test_greedy_specinfer_equals_autoregressive(tiny_target, tiny_draft, budget, depth):
    """120 tokens over many iterations, so the pruned caches are exercised too."""
    engine = TreeEngine(SPECINFER, tiny_target, tiny_draft, [], TreeShape(budget, depth))
    events = assert_greedy_equals_autoregressive(tiny_target, engine, max_new_tokens=120)
    assert all(e.tree_size <= budget and e.depth <= depth for e in events) and len(events) > 20


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_specinfer_same_seed_same_tokens_and_iterations(tiny_target, tiny_draft, sampling):
    assert_reproducible(TreeEngine(SPECINFER, tiny_target, tiny_draft, [], TreeShape(budget=16, max_depth=8)), sampling)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_specinfer_sampled_trees_stay_within_budget(tiny_target, rough_draft, sampling):
    for budget in (2, 5, 16, 30):
        _, events = run(TreeEngine(SPECINFER, tiny_target, rough_draft, [], TreeShape(budget, 8)), sampling)
        assert all(e.tree_size <= budget and e.depth <= 8 for e in events)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_specinfer_first_and_second_tokens_follow_the_target(tiny_target, rough_draft, sampling):
    """Budget 4: two stems of two tokens, so the first token may be the first or the second
    candidate or a residual sample after both were rejected, and likewise at depth two."""
    engine = TreeEngine(SPECINFER, tiny_target, rough_draft, [], TreeShape(budget=4, max_depth=4))
    routes = assert_follows_target(tiny_target, engine, sampling)
    assert routes[(2,)] > 0 and routes[(1,)] > 0 and routes[(0, 1)] + routes[(0, 0)] > 0


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_self_drafted_specinfer_accepts_a_whole_stem_every_iteration(tiny_target, sampling):
    """p == q (up to float64 rounding), so the first candidate at every node is accepted; a
    misaligned slot or position in either cache would break that across iterations."""
    _, events = run(TreeEngine(SPECINFER, tiny_target, tiny_target, [], TreeShape(budget=9, max_depth=8)), sampling, 33)
    assert [e.accepted for e in events] == [0] + [3] * 8  # the prompt's pass emits the first token


def test_specinfer_respects_stop_tokens_and_the_token_limit(tiny_target, tiny_draft):
    assert_stops_at_stop_token(tiny_target, specinfer(tiny_target, tiny_draft))
    assert_token_limit(specinfer(tiny_target, tiny_target))


def test_specinfer_budget_change_applies_mid_reply(tiny_target, tiny_draft):
    engine = TreeEngine(SPECINFER, tiny_target, tiny_draft, [], TreeShape(budget=1, max_depth=8))
    stream = engine.generate(PROMPT, 30, SAMPLINGS[1])
    next(stream)  # the prompt's pass
    first = next(stream)
    engine.apply(LiveSettings(budget=16))  # 4 stems of 4
    rest = list(stream)
    assert first.tree_size == 1 and {e.depth for e in rest} == {4} and max(e.tree_size for e in rest) > 4
