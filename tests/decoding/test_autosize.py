"""--budget auto's rule: the cut that maximizes predicted tokens per second, growth that stops
when the next draft step cannot pay for itself, and the online calibration."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from specchat.decoding.autosize import LOOK_SHARE, AutoSizer, Costs, Observed, interpolate
from specchat.decoding.calibration import MIN_TREES, Calibration

FLAT = Costs(target_n=(1, 1024), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(0.01, 0.01))


def probs(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_interpolation_is_linear_inside_and_extends_the_end_segments():
    xs, ys = (1, 16, 64), (0.1, 0.2, 0.5)
    assert interpolate(xs, ys, 1) == pytest.approx(0.1)
    assert interpolate(xs, ys, 40) == pytest.approx(0.35)
    assert interpolate(xs, ys, 128) == pytest.approx(0.9)  # past the end: the last slope
    assert interpolate(xs, ys, 0) >= 0.0
    assert interpolate((8,), (0.3,), 100) == 0.3


@pytest.mark.parametrize("seed", range(4))
def test_an_iteration_at_every_pass_size_at_once_is_each_one_to_the_bit(seed):
    """best_cut's vectorized times are the scalar ones exactly (the same cut on ties): random
    costs in memory, streamed, streamed by expert with fetches and whole layers from a width."""
    rng = np.random.default_rng(seed)
    knots = (1, 16, 64, 256)
    costs = Costs(knots, tuple(np.sort(rng.random(4))), knots, tuple(np.sort(rng.random(4))), stream_s=rng.random(),
                  staged=rng.random(), fetch_s=tuple(rng.random(4)) if seed % 2 else (),
                  wide_from=float(rng.integers(2, 300)), wide_stream_s=rng.random())
    sizer = AutoSizer(costs if seed else dataclasses.replace(costs, target_n=(8,), target_s=(0.3,)), cap=512)
    sizer.calibration.target_time.record_time(1.0, 0.5 + rng.random())
    n = np.arange(1, 513)
    for spent in (0.0, rng.random() / 10, 2.0):
        assert sizer.iterations_s(spent, n).tolist() == [sizer.iteration_s(spent, int(k)) for k in n]


def test_flat_target_cost_scores_every_node_worth_anything():
    sizer = AutoSizer(FLAT, cap=64)
    cut = sizer.best_cut(probs(0.9, 0.5, 0.2, 0.01), draft_spent=0.05)
    assert cut.size == 4 and cut.predicted == pytest.approx(1.61)
    assert cut.rate == pytest.approx(2.61 / 0.15)


def test_costly_target_tokens_cut_the_unlikely_tail():
    # each scored token costs 10 ms: a node of probability 0.01 adds 1% of a token for it
    costs = Costs(target_n=(1, 101), target_s=(0.1, 1.1), draft_b=(1,), draft_s=(0.01,))
    cut = AutoSizer(costs, cap=64).best_cut(probs(0.9, 0.5, 0.3, 0.01), draft_spent=0.0)
    assert cut.size == 3


def test_the_cap_bounds_the_cut():
    cut = AutoSizer(FLAT, cap=2).best_cut(probs(0.9, 0.8, 0.7), draft_spent=0.0)
    assert cut.size == 2


def test_a_cheap_step_over_likely_nodes_is_taken():
    sizer = AutoSizer(FLAT, cap=64)
    assert sizer.step_width(probs(0.9, 0.8), probs(0.9, 0.8), draft_spent=0.01) >= 1


def test_growth_stops_when_a_step_costs_more_than_it_can_gain():
    # a draft step costs as much as a whole target pass; the open nodes are unlikely
    costs = Costs(target_n=(1,), target_s=(0.1,), draft_b=(1,), draft_s=(0.1,))
    sizer = AutoSizer(costs, cap=64)
    assert sizer.step_width(probs(0.05, 0.04), probs(0.9, 0.05, 0.04), draft_spent=0.1) == 0


def test_an_iteration_is_drafting_then_a_pass_that_waits_for_what_was_not_staged():
    memory = Costs(target_n=(1,), target_s=(0.5,), draft_b=(1,), draft_s=(0.1,))
    assert memory.iteration(0.3, 8) == pytest.approx(0.8)  # d + tau
    staged = Costs(target_n=(1,), target_s=(0.5,), draft_b=(1,), draft_s=(0.1,), stream_s=2.0)
    assert staged.iteration(0.3, 8) == pytest.approx(2.0)  # the link's 2 s: drafting was free
    assert staged.iteration(1.8, 8) == pytest.approx(2.3)  # max(d + tau, S)
    half = Costs(target_n=(1,), target_s=(0.5,), draft_b=(1,), draft_s=(0.1,), stream_s=2.0, staged=0.5)
    assert half.iteration(3.0, 8) == pytest.approx(4.0)  # 1 s of the pass could not be staged


def test_the_experts_a_pass_fetches_add_to_its_iteration_by_its_tokens():
    # streamed by expert: 1 s of heads staged, then what the tree's tokens route to, fetched after
    moe = Costs(target_n=(1, 17), target_s=(0.5, 0.5), draft_b=(1,), draft_s=(0.1,), stream_s=1.0,
                fetch_s=(0.2, 1.0))
    assert moe.iteration(1.0, 1) == pytest.approx(1.5 + 0.2)  # d + tau + F(1): the heads were free
    assert moe.iteration(1.0, 9) == pytest.approx(1.5 + 0.6)  # F interpolated: 0.2 + 8 * 0.05


def test_a_tree_is_cut_smaller_when_its_tokens_fetch_more_experts():
    # ten likely nodes, then unlikely ones; the same costs but for what the tokens fetch
    likely = probs(*([0.8] * 10 + [0.05] * 40))
    flat = Costs(target_n=(1, 65), target_s=(0.5, 0.5), draft_b=(1,), draft_s=(0.01,))
    fetching = dataclasses.replace(flat, fetch_s=(0.1, 6.5))  # 0.1 s a token's experts
    assert AutoSizer(flat, cap=64).best_cut(likely, draft_spent=0.1).size == 50
    assert AutoSizer(fetching, cap=64).best_cut(likely, draft_spent=0.1).size == 10


def test_drafting_while_the_link_moves_the_next_pass_is_taken_however_costly():
    # the step that does not pay in memory (test above) is free when the link needs the time anyway
    costs = Costs(target_n=(1,), target_s=(0.1,), draft_b=(1,), draft_s=(0.1,), stream_s=1.0)
    sizer = AutoSizer(costs, cap=64)
    assert sizer.step_width(probs(0.05, 0.04), probs(0.9, 0.05, 0.04), draft_spent=0.1) > 0
    assert sizer.best_cut(probs(0.9, 0.05, 0.04), draft_spent=0.1).size == 3


def test_no_open_node_or_a_full_tree_of_likelier_nodes_stops_growth():
    sizer = AutoSizer(FLAT, cap=2)
    assert sizer.step_width(probs(), probs(0.9), draft_spent=0.0) == 0
    assert sizer.step_width(probs(0.1), probs(0.9, 0.8), draft_spent=0.0) == 0


def test_the_width_is_where_the_expected_rate_peaks():
    # widths cost the same: the widest step over many likely nodes wins
    sizer = AutoSizer(FLAT, cap=1024)
    open_probs = torch.full((200,), 0.5, dtype=torch.float64)
    assert sizer.step_width(open_probs, open_probs, draft_spent=0.0) == 128


@pytest.mark.parametrize("count", [1, 2, 4, 8, 16, 32, 64])
def test_a_step_may_expand_any_power_of_two_of_open_nodes_up_to_128(count):
    """Widths cost the same, so the widest step over `count` likely open nodes is all of them: each
    power of two is a width the rule weighs, the count of open nodes included."""
    open_probs = torch.full((count,), 0.5, dtype=torch.float64)
    assert AutoSizer(FLAT, cap=1024).step_width(open_probs, open_probs, draft_spent=0.0) == count


# each scored token costs 10 ms, a draft step 1 ms at any width
COSTLY_PASS = Costs(target_n=(1, 101), target_s=(0.1, 1.1), draft_b=(1, 128), draft_s=(0.001, 0.001))


def test_a_step_expands_the_open_nodes_worth_the_pass_tokens_they_add():
    """Now one node (0.9) is cut: 1.9 tokens in 0.11 s. Expanding the two likely open nodes adds 1.8
    tokens for 0.02 s of pass and 1 ms of step (3.7 in 0.131 s); one node gives 2.8 in 0.121 s, and
    the four after them 0.004 tokens for 0.04 s more."""
    sizer = AutoSizer(COSTLY_PASS, cap=64)
    assert sizer.step_width(probs(0.9, 0.9, *[0.001] * 6), probs(0.9), draft_spent=0.0) == 2


def test_a_step_is_taken_where_its_nodes_just_pay_for_their_pass_tokens_and_not_below():
    """Now 1.9 tokens in 0.11 s (the cut node and the root in the pass): 17.3 tokens/s. One open
    node of 0.3 (its kept share 0.9, the prior) gives 2.17 in 0.121 s, 17.9/s; one of 0.001
    gives 1.901 in 0.121 s."""
    sizer = AutoSizer(COSTLY_PASS, cap=64)
    assert sizer.step_width(probs(0.3), probs(0.9), draft_spent=0.0) == 1
    assert sizer.step_width(probs(*[0.001] * 4), probs(0.9), draft_spent=0.0) == 0


def test_an_expansions_gain_is_the_kept_share_of_its_nodes_mass():
    """Now 1.9 tokens in 0.1 s (a flat pass); one open node of 0.3 behind a 10 ms step is worth
    0.3 m tokens, m the share of an expanded parent's mass its kept children hold: it pays at the
    prior m = 0.9 (2.17 tokens in 0.11 s against 2.09), not once the children keep a quarter (1.975)."""
    costs = Costs(target_n=(1, 1024), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(0.01, 0.01))
    sizer = AutoSizer(costs, cap=64)
    assert sizer.calibration.branching == pytest.approx(0.9)
    assert sizer.step_width(probs(0.3), probs(0.9), draft_spent=0.0) == 1
    for _ in range(200):
        sizer.calibration.record_expansion(parent_mass=1.0, child_mass=0.25)
    assert sizer.calibration.branching == pytest.approx(0.25, abs=0.01)
    assert sizer.step_width(probs(0.3), probs(0.9), draft_spent=0.0) == 0


def test_calibration_follows_what_verification_accepts():
    calibration = Calibration()
    assert calibration.acceptance == 1.0
    for _ in range(200):
        calibration.record(predicted=4.0, observed=2)
        calibration.record_expansion(parent_mass=1.0, child_mass=0.5)
    assert calibration.acceptance == pytest.approx(0.5, rel=1e-3)
    assert calibration.branching == pytest.approx(0.5, rel=1e-3)


def test_a_pessimistic_calibration_cuts_smaller_trees():
    sizer = AutoSizer(Costs(target_n=(1, 101), target_s=(0.1, 0.6), draft_b=(1,), draft_s=(0.01,)), cap=64)
    tree = probs(0.9, 0.6, 0.4, 0.2, 0.1, 0.05)
    optimistic = sizer.best_cut(tree, 0.0).size
    for _ in range(100):
        sizer.calibration.record(predicted=1.0, observed=0)
    assert sizer.best_cut(tree, 0.0).size < optimistic


# tau(n) = 0.1 + 0.01 (n - 1) s; a draft step, or a catch-up of any length, 0.02 s
LINEAR = Costs(target_n=(1, 65), target_s=(0.1, 0.74), draft_b=(1, 64), draft_s=(0.02, 0.02))
# a tree of 4 nodes grown by the root's step and two more of one node: under LINEAR a drafting
# iteration takes 0.02 + 2 * 0.02 + (0.1 + 0.01 * 4) = 0.2 s, whatever its catch-up
TREE = dict(catch_up=2, widths=(1, 1), size=4, predicted=2.0)
TREE_S = 0.2
ALONE_S = 0.1  # tau(1): the target alone's pass over the root


def drafted(accepted: int) -> Observed:
    return Observed(tokens=accepted + 1, target_s=0.14, draft_s=0.06, accepted=accepted, **TREE)


def test_until_a_few_trees_were_grown_it_drafts_to_learn():
    """The first tree (its times are the kernels' first use) does not count; the next MIN_TREES do."""
    sizer = AutoSizer(LINEAR, cap=64, learns_costs=False)
    for _ in range(1 + MIN_TREES):
        choice = sizer.choose(pending=40)
        assert choice.draft and not choice.look and choice.with_tree == 0.0
        sizer.record(drafted(accepted=0))  # trees that would turn drafting off once judged: 5 tokens/s
    assert not sizer.choose(pending=2).draft


def test_drafting_turns_off_when_the_draft_costs_more_than_it_saves_and_on_again_when_acceptance_rises():
    sizer = AutoSizer(LINEAR, cap=64, learns_costs=False)
    alone = 1 / (ALONE_S * (1 + LOOK_SHARE))  # 9.8 tokens/s
    rate = DraftingRate()
    sizer.record(drafted(accepted=0))  # the first tree: it counts for acceptance only
    for _ in range(MIN_TREES):  # 3 tokens in 0.2 s
        sizer.record(drafted(accepted=2))
        rate.add(3)
    choice = sizer.choose(pending=2)
    assert choice.draft and choice.with_tree == pytest.approx(rate.value) == pytest.approx(15.0)
    assert choice.alone == pytest.approx(alone)

    while rate.value > alone:  # the draft stops being right: 1 token in 0.2 s
        sizer.record(drafted(accepted=0))
        rate.add(1)
    choice = sizer.choose(pending=2)
    assert not choice.draft and choice.with_tree == pytest.approx(rate.value)

    # a look costs its 0.2 s less the time the target alone takes for its tokens
    look_after = math.ceil((TREE_S - rate.mean_tokens * ALONE_S) / (LOOK_SHARE * ALONE_S))
    for _ in range(look_after - 1):
        sizer.record(Observed(tokens=1, target_s=ALONE_S))
    assert not sizer.choose(pending=look_after).draft
    sizer.record(Observed(tokens=1, target_s=ALONE_S))
    look = sizer.choose(pending=look_after + 1)
    assert look.draft and look.look

    sizer.record(drafted(accepted=4))  # the look finds the draft right again: 5 tokens in 0.2 s
    rate.add(5)
    assert sizer.undrafted == 0
    while rate.value <= alone:  # as do later looks
        assert not sizer.choose(pending=2).draft
        sizer.record(drafted(accepted=4))
        rate.add(5)
    choice = sizer.choose(pending=2)
    assert choice.draft and not choice.look and choice.with_tree == pytest.approx(rate.value)


def test_a_look_waits_longer_for_a_long_catch_up():
    """A look costs its tree's time less the target alone's for its tokens, plus what its catch-up
    takes beyond a steady one's: with drafting at 1 token in 0.2 s a steady look costs 0.1 s, due once
    2% of the target alone's passes since the last tree (0.1 s each) reach it, 50 tokens; a 40-token
    catch-up (0.5 s) adds 0.48 s, and the look waits for 290."""
    costs = Costs(target_n=(1, 65), target_s=(0.1, 0.74), draft_b=(1, 2, 40, 64), draft_s=(0.02, 0.02, 0.5, 0.74))
    sizer = AutoSizer(costs, cap=64, learns_costs=False)
    for _ in range(1 + MIN_TREES):  # the first (cold) tree counts for acceptance only
        sizer.record(drafted(accepted=0))
    for _ in range(60):
        sizer.record(Observed(tokens=1, target_s=ALONE_S))
    assert sizer.choose(pending=2).look
    assert not sizer.choose(pending=40).draft
    for _ in range(290 - 60):
        sizer.record(Observed(tokens=1, target_s=ALONE_S))
    assert sizer.choose(pending=40).look


class DraftingRate:
    """The test's own account of the rate: tokens and TREE_S seconds an iteration, decayed by 0.95."""

    def __init__(self) -> None:
        self.tokens = self.weight = 0.0

    def add(self, tokens: int) -> None:
        self.tokens = 0.95 * self.tokens + tokens
        self.weight = 0.95 * self.weight + 1

    @property
    def value(self) -> float:
        return self.tokens / (self.weight * TREE_S)

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.weight


def test_a_catch_up_past_a_steady_ones_does_not_count_against_drafting():
    # a draft step 0.02 s up to 2 rows, a 40-token catch-up 0.5 s
    costs = Costs(target_n=(1, 65), target_s=(0.1, 0.74), draft_b=(1, 2, 40, 64), draft_s=(0.02, 0.02, 0.5, 0.74))
    sizer = AutoSizer(costs, cap=64)
    sizer.record(Observed(tokens=1, target_s=1.0, draft_s=1.0, catch_up=2, widths=(1,), size=1))  # cold: left out
    for catch_up in (40,) + (2,) * (MIN_TREES - 1):  # times as the probe says: after a 40-token catch-up, steady ones
        catch_up_s = costs.draft(catch_up)
        sizer.record(Observed(tokens=3, target_s=0.14, draft_s=catch_up_s + 0.04, catch_up=catch_up,
                              catch_up_s=catch_up_s, widths=(1, 1), size=4, predicted=2.0, accepted=2))
    assert sizer.choose(pending=2).with_tree == pytest.approx(3 / (0.02 + 0.04 + 0.14))  # each counts as steady
    assert sizer.excess_catch_up_s(40) == pytest.approx(0.5 - 0.02)
    sizer.record(Observed(tokens=3, target_s=0.14, draft_s=0.64, catch_up=40, catch_up_s=0.6, widths=(1, 1), size=4,
                          predicted=2.0, accepted=2))  # a long catch-up 1.2 times the probe's
    long_ones = (0.95 * (0.95 * 2 + 1) + 1.2) / (0.95 * (0.95 * 2 + 1) + 1)  # long catch-ups: 1.0, then 1.2 the probe's
    assert sizer.calibration.catch_up_time.value == pytest.approx(long_ones)
    assert sizer.excess_catch_up_s(40) == pytest.approx(long_ones * 0.5 - sizer.draft_s(2))


def test_costs_follow_what_iterations_take():
    sizer = AutoSizer(LINEAR, cap=64)
    for _ in range(200):  # drafting takes twice what the probe said, the target's pass half
        sizer.record(Observed(tokens=2, target_s=0.07, draft_s=0.12, accepted=1, **TREE))
    assert sizer.draft_s(1) == pytest.approx(0.04, rel=1e-3)
    assert sizer.iteration_s(0.1, 5) == pytest.approx(0.1 + 0.07, rel=1e-3)
    assert sizer.alone_s() == pytest.approx(0.05, rel=1e-3)  # the target alone starts from the passes' ratio
    for _ in range(200):  # and is learned apart: it takes 1.3 times what the probe said
        sizer.record(Observed(tokens=1, target_s=0.13))
    assert sizer.alone_s() == pytest.approx(0.13, rel=1e-3)
    assert sizer.iteration_s(0.1, 5) == pytest.approx(0.1 + 0.07, rel=1e-3)  # the tree passes' stays


def test_stand_in_costs_hold_as_given_when_not_learned():
    sizer = AutoSizer(LINEAR, cap=64, learns_costs=False)
    for _ in range(20):
        sizer.record(Observed(tokens=2, target_s=0.07, draft_s=0.12, accepted=1, **TREE))
        sizer.record(Observed(tokens=1, target_s=0.3))
    assert sizer.draft_s(1) == 0.02 and sizer.iteration_s(0.1, 5) == pytest.approx(0.24) and sizer.alone_s() == 0.1


def test_a_short_and_a_long_iteration_move_a_time_ratio_alike():
    """Each iteration is one record, whatever its length: 40 ms taking twice the prediction moves
    the ratio as far as 10 s taking twice it (summed seconds would weigh the long one 250 times)."""
    short, long = Calibration(), Calibration()
    short.draft_time.record_time(0.04, 0.08)
    long.draft_time.record_time(10.0, 20.0)
    assert short.draft_time.value == long.draft_time.value == pytest.approx((0.95 * 2 + 2) / (0.95 * 2 + 1))
