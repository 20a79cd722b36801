"""--budget auto's rule: the cut that maximizes predicted tokens per second, growth that stops
when the next draft step cannot pay for itself, and the online calibration."""

import dataclasses
import math

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
# a tree of 4 nodes predicted to yield 2 tokens, grown by the root's step and two more of one node
TREE = dict(catch_up=2, widths=(1, 1), size=4, predicted=2.0)


def drafted(accepted: int) -> Observed:
    return Observed(tokens=accepted + 1, target_s=0.14, draft_s=0.06, accepted=accepted, **TREE)


def test_until_a_few_trees_were_grown_it_drafts_to_learn():
    sizer = AutoSizer(LINEAR, cap=64, learns_costs=False)
    for _ in range(MIN_TREES):
        choice = sizer.choose(pending=40)
        assert choice.draft and not choice.look and choice.with_tree == 0.0
        sizer.record(drafted(accepted=0))  # trees that would turn drafting off once judged
    assert not sizer.choose(pending=2).draft


def test_drafting_turns_off_when_the_draft_costs_more_than_it_saves_and_on_again_when_acceptance_rises():
    sizer = AutoSizer(LINEAR, cap=64, learns_costs=False)
    alone_s = 0.1  # tau(1): the target alone's pass over the root
    tree_s = 0.02 + 2 * 0.02 + (0.1 + 0.01 * 4)  # catch-up (the root's step), two steps, a pass over 5 tokens
    alone = 1 / (alone_s * (1 + LOOK_SHARE))

    def with_tree() -> float:
        return (sizer.calibration.acceptance * TREE["predicted"] + 1) / tree_s

    for _ in range(MIN_TREES):
        sizer.record(drafted(accepted=2))
    choice = sizer.choose(pending=2)
    assert choice.with_tree == pytest.approx(with_tree()) and choice.alone == pytest.approx(alone)
    assert choice.draft and with_tree() == pytest.approx(15.0)  # c = 1: 3 tokens in 0.2 s beat 9.8 tokens/s

    while sizer.calibration.acceptance > 0.3:  # the draft stops being right
        sizer.record(drafted(accepted=0))
    choice = sizer.choose(pending=2)
    assert with_tree() < alone and not choice.draft  # (2c + 1) / 0.2 < 9.8 once c < 0.49

    # a look costs 0.2 s against the (2c + 1) tokens the target alone makes in that time
    loss = tree_s - (sizer.calibration.acceptance * TREE["predicted"] + 1) * alone_s
    look_after = math.ceil(loss / (LOOK_SHARE * alone_s))
    for _ in range(look_after - 1):
        sizer.record(Observed(tokens=1, target_s=alone_s))
    assert not sizer.choose(pending=look_after).draft
    sizer.record(Observed(tokens=1, target_s=alone_s))
    look = sizer.choose(pending=look_after + 1)
    assert look.draft and look.look

    sizer.record(drafted(accepted=4))  # the look finds the draft right again
    assert sizer.undrafted == 0
    while not sizer.choose(pending=2).draft:  # as do later looks
        sizer.record(drafted(accepted=4))
    assert sizer.calibration.acceptance > (alone * tree_s - 1) / TREE["predicted"]
    assert not sizer.choose(pending=2).look


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
