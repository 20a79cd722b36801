"""The accept / residual math of speculative sampling on small hand-made distributions."""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from specchat.decoding.events import SamplingParams
from specchat.decoding.keyed import Purpose, derived_uniform
from specchat.decoding.llama_cuts import xtc_cuts_at
from specchat.decoding.sampling import filtered_probs
from specchat.decoding.speculative_sampling import (
    accepts,
    distribution,
    draw_draft,
    emit,
    first_accepted,
    residual,
)

P = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
Q = torch.tensor([0.2, 0.2, 0.1, 0.5], dtype=torch.float64)


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, candidates: int) -> torch.Tensor:
    """Exact law of the emitted token with `candidates` i.i.d. draws from q, by recursion on the
    first draw: accepted with probability min(1, p / q), else the rest runs against the residual."""
    if candidates == 0:
        return p
    accept = torch.minimum(p / q, torch.ones_like(p)).nan_to_num(0.0)  # q = 0 is never drawn
    rejected = float((q * (1 - accept)).sum())
    return q * accept + rejected * emitted_distribution(residual(p, q), q, candidates - 1)


@pytest.mark.parametrize("candidates", [0, 1, 2, 3, 5])
def test_multi_candidate_rejection_emits_the_target_distribution(candidates):
    assert torch.allclose(emitted_distribution(P, Q, candidates), P, atol=1e-12)
    assert torch.allclose(emitted_distribution(Q, P, candidates), Q, atol=1e-12)


def test_accept_probability_is_min_one_p_over_q():
    # token 0: p >= q, always accepted; token 1: p == q; token 3: p == 0, never
    for u in (0.0, 0.5, 1 - 2**-53):
        assert accepts(P, Q, 0, u) and accepts(P, Q, 1, u)
        assert not accepts(P, Q, 3, u)
    # with the roles swapped, token 0 has p / q = 0.2 / 0.5 = 0.4: accepted iff u < 0.4
    assert accepts(Q, P, 0, 0.39) and not accepts(Q, P, 0, 0.4) and not accepts(Q, P, 0, 0.41)


def test_residual_is_normalised_positive_part():
    expected = torch.tensor([0.3, 0.1, 0.1, 0.0], dtype=torch.float64) / 0.5
    assert torch.allclose(residual(P, Q), expected)
    assert residual(P, Q)[3] == 0  # a token q over-proposes can never come back


def test_residual_of_equal_distributions_is_the_target():
    """p <= q everywhere only happens as rounding of p == q; the residual falls back to p."""
    assert torch.equal(residual(P, P), P)


def test_greedy_is_one_hot_matching():
    logits = torch.tensor([1.0, 3.0, 3.0, -2.0])
    greedy = SamplingParams(temperature=0.0, top_p=1.0, seed=0)
    p = distribution(logits, greedy, 7)
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]  # the first maximum, like sample_token
    q = distribution(torch.tensor([0.0, 0.0, 5.0, 0.0]), greedy, 7)
    rank, rest = first_accepted(p, q, [2, 2], seed=0, position=7)
    assert rank is None and emit(rest, seed=0, position=7) == 1  # the target's argmax
    assert first_accepted(p, p, [1], seed=0, position=7)[0] == 0


def test_distribution_is_the_filtered_target():
    logits = torch.tensor([0.3, 2.0, -1.0, 1.1, 0.0])
    sampling = SamplingParams(temperature=0.6, top_p=0.9, seed=0)
    assert torch.equal(distribution(logits, sampling, 3), filtered_probs(logits, 0.6, 0.9))


def test_distribution_drops_the_top_choices_where_xtcs_coin_fell():
    """sd's and specinfer's target distribution at a position is the one sequential sampling draws from there."""
    logits = torch.tensor([0.3, 2.0, -1.0, 1.9, 0.0])
    sampling = SamplingParams(temperature=1.0, top_p=1.0, seed=4, xtc_probability=0.5, xtc_threshold=0.2)
    fell = [position for position in range(40) if xtc_cuts_at(4, position, 0.5)]
    assert 0 < len(fell) < 40
    for position in range(40):
        p = distribution(logits, sampling, position)
        assert (p[1] == 0) == (position in fell) and p[3] > 0  # 2.0 gives way to 1.9, the least of the two


@pytest.mark.parametrize("candidates", [1, 3])
def test_keyed_multi_candidate_sampling_follows_p(candidates):
    """End to end with the keyed uniforms: draft draws, acceptance tests and the emission use
    separate streams, so across seeds the emitted token follows p (chi-square)."""
    position, counts = 9, Counter()
    for seed in range(20000):
        drafts = [draw_draft(Q, seed, stem, position) for stem in range(candidates)]
        rank, rest = first_accepted(P, Q, drafts, seed, position)
        counts[drafts[rank] if rank is not None else emit(rest, seed, position)] += 1
    assert counts[3] == 0
    observed = [counts[t] for t in range(3)]
    assert chisquare(observed, [20000 * float(P[t]) for t in range(3)]).pvalue > 1e-3


def test_each_decision_draws_from_its_documented_stream():
    """The streams keyed.Purpose documents, pinned: a draft token of stem s from DRAFT's index s,
    the first acceptance test from ACCEPT's index 0, the emission from EMIT's index 0. Another index
    would pass every law above (it is as uniform) yet change every seeded reply of these engines."""
    seed, position = 11, 40
    flat = torch.full((4,), 0.25, dtype=torch.float64)  # inverse CDF: token floor(4 u)
    for stem in range(3):
        assert draw_draft(flat, seed, stem, position) == int(4 * derived_uniform(seed, Purpose.DRAFT, stem, position))
    assert emit(flat, seed, position) == int(4 * derived_uniform(seed, Purpose.EMIT, 0, position))
    # the token is accepted where u q < p: p at exactly u q rejects it, a hair above accepts it
    u = derived_uniform(seed, Purpose.ACCEPT, 0, position)
    q = torch.tensor([0.5, 0.5], dtype=torch.float64)
    for margin, accepted in ((0.0, None), (1e-9, 0)):
        p = torch.tensor([u * 0.5 + margin, 1 - u * 0.5 - margin], dtype=torch.float64)
        assert first_accepted(p, q, [0], seed, position)[0] == accepted
