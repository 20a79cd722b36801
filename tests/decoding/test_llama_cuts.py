"""Top-n-sigma and XTC (decoding/llama_cuts.py) against llama.cpp's samplers written out here from
their definitions, and XTC's coin: keyed by (seed, position), as often as asked, apart from u_n."""

import math

import numpy as np
import pytest
import torch

from specchat.decoding.events import SamplingParams
from specchat.decoding.keyed import uniform
from specchat.decoding.llama_cuts import cut_top_n_sigma, cut_xtc, xtc_cuts_at
from specchat.decoding.sampling import filter_logits, sample_token, sampled_probs


def llama_top_n_sigma(logits: list[float], n: float) -> list[bool]:
    """llama.cpp's llama_sampler_top_n_sigma_apply as a loop: max and mean of the finite logits,
    their population deviation, then each logit below max - n std cut. Returns what stays."""
    finite = [x for x in logits if x != -math.inf]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((x - mean) ** 2 for x in finite) / len(finite))
    return [x >= max(finite) - n * std for x in logits]


def llama_xtc(probs: list[float], threshold: float) -> list[bool]:
    """llama.cpp's llama_sample_xtc_apply once its coin fell: sorted by probability, the tokens
    before the last one at least `threshold` likely are removed, where that last is not the first."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    last = max((rank for rank, i in enumerate(order) if probs[i] >= threshold), default=0)
    removed = set(order[:last])
    return [i not in removed for i in range(len(probs))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [0.5, 1.0, 2.0, 3.0])
def test_top_n_sigma_keeps_what_llama_cpps_loop_keeps(seed, n):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(300, generator=generator, dtype=torch.float64) * 3
    logits[torch.randperm(300, generator=generator)[:40]] = -math.inf  # cut by an earlier step
    kept = torch.isfinite(cut_top_n_sigma(logits, n)).tolist()
    assert kept == llama_top_n_sigma(logits.tolist(), n)
    assert 0 < sum(kept) < 260  # it cut, and kept the top


@pytest.mark.parametrize("n", [0.0, -1.0])
def test_a_top_n_sigma_of_zero_or_less_cuts_nothing_as_llama_cpps(n):
    logits = torch.randn(300, generator=torch.Generator().manual_seed(2))
    assert torch.equal(filter_logits(logits, 0.7, 1.0, top_n_sigma=n), filter_logits(logits, 0.7, 1.0))
    assert torch.isfinite(filter_logits(logits, 0.7, 1.0, top_n_sigma=n)).all()


@pytest.mark.parametrize("n", [0.25, 0.5, 1.0, 2.0])
def test_the_chain_cuts_at_any_positive_top_n_sigma_below_one_too(n):
    """Every n > 0 is a cut in llama.cpp (only n <= 0 turns it off): the chain's is the cut's own."""
    logits = torch.randn(300, generator=torch.Generator().manual_seed(4))
    chained = filter_logits(logits, 0.7, 1.0, top_n_sigma=n)
    assert torch.equal(chained, cut_top_n_sigma(logits / 0.7, n))
    assert not torch.isfinite(chained).all()


def test_top_n_sigma_is_the_same_set_after_temperature_and_rows_cut_alone():
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(3))
    for temperature in (0.3, 0.7, 1.6):
        assert torch.equal(torch.isfinite(cut_top_n_sigma(logits / temperature, 1.5)),
                           torch.isfinite(cut_top_n_sigma(logits, 1.5)))
    rows = torch.stack([cut_top_n_sigma(row, 1.5) for row in logits])
    assert torch.equal(cut_top_n_sigma(logits, 1.5), rows)


def test_a_token_exactly_n_sigma_below_the_largest_stays_as_in_llama_cpps_loop():
    """Logits 1 and -1: mean 0, deviation 1, so at n = 2 the floor is -1 exactly (no rounding)."""
    assert torch.isfinite(cut_top_n_sigma(torch.tensor([1.0, -1.0]), 2.0)).tolist() == llama_top_n_sigma(
        [1.0, -1.0], 2.0) == [True, True]


@pytest.mark.parametrize(("probs", "threshold", "kept"), [
    ([0.4, 0.3, 0.2, 0.1], 0.25, [False, True, True, True]),  # the likeliest gives way to the next
    ([0.1, 0.2, 0.3, 0.4], 0.15, [True, True, False, False]),  # in id order: the least above stays
    ([0.4, 0.3, 0.2, 0.1], 0.35, [True, True, True, True]),  # one above: nothing to exclude
    ([0.05, 0.05, 0.9], 0.01, [True, True, False]),  # tied least likely: both stay
    ([0.5, 0.25, 0.25], 0.25, [False, True, True]),  # at the threshold exactly: counted, as llama.cpp's >=
])
def test_xtc_removes_the_likely_tokens_but_the_least_of_them(probs, threshold, kept):
    logits = torch.tensor(probs, dtype=torch.float64).log()
    assert torch.isfinite(cut_xtc(logits, threshold)).tolist() == kept


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("threshold", [0.02, 0.05, 0.1, 0.2])
def test_xtc_keeps_what_llama_cpps_loop_keeps(seed, threshold):
    logits = torch.randn(64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    probs = torch.softmax(logits, dim=0).tolist()
    assert torch.isfinite(cut_xtc(logits, threshold)).tolist() == llama_xtc(probs, threshold)


def test_xtc_cuts_each_row_by_its_own_distribution():
    logits = torch.tensor([[2.0, 2.0, -5.0], [5.0, -5.0, -5.0]])
    assert torch.isfinite(cut_xtc(logits, 0.3)).tolist() == [[True, True, True], [True, True, True]]
    logits[0, 0] = 2.5
    assert torch.isfinite(cut_xtc(logits, 0.3)).tolist() == [[False, True, True], [True, True, True]]


# Measured here (2026-12-02; the draws are integer arithmetic, the same on any machine): over these
# 20,000 positions of seed 7, how far the share of falls lies from the probability, and the falls'
# correlation with u_n; each bound is twice that figure (a binomial's 1 sigma is 0.0021-0.0035 here).
@pytest.mark.parametrize(("probability", "measured_share_gap", "measured_correlation"),
                         [(0.1, 0.00405, 0.0025), (0.5, 0.00295, 0.0062), (0.9, 0.0009, 0.0075)])
def test_xtcs_coin_falls_as_often_as_asked_apart_from_the_emitted_tokens_draw(probability, measured_share_gap,
                                                                              measured_correlation):
    falls = np.array([xtc_cuts_at(7, position, probability) for position in range(20_000)])
    assert abs(falls.mean() - probability) < 2 * measured_share_gap
    u = np.array([uniform(7, position) for position in range(20_000)])
    assert abs(np.corrcoef(falls, u)[0, 1]) < 2 * measured_correlation  # its own stream, not u_n's
    assert falls.tolist() == [xtc_cuts_at(7, position, probability) for position in range(20_000)]
    assert falls.tolist() != [xtc_cuts_at(8, position, probability) for position in range(20_000)]


def test_xtcs_coin_never_falls_at_0_and_always_at_1():
    assert not any(xtc_cuts_at(1, position, 0.0) for position in range(2000))
    assert all(xtc_cuts_at(1, position, 1.0) for position in range(2000))


def test_the_chain_applies_top_n_sigma_first_and_xtc_last():
    """Top-n-sigma before top-k: on the whole vocabulary, not on the k left; XTC after min-p: on what
    the cuts left, renormalised."""
    logits = torch.tensor([4.0, 3.9, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    by_sigma = torch.isfinite(filter_logits(logits, 1.0, 1.0, top_k=3, top_n_sigma=1.0))
    assert by_sigma.tolist() == [True, True, True] + [False] * 5  # over 3 kept: sigma 0.4 would cut the third
    xtc = torch.isfinite(filter_logits(logits, 1.0, 1.0, top_k=2, xtc_threshold=0.4))
    assert xtc.tolist() == [False, True] + [False] * 6  # both over 0.4 of the two left


def test_sampled_tokens_never_take_the_top_where_the_coin_fell():
    logits = torch.tensor([3.0, 2.5, 2.0, -1.0, -2.0])
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=5, xtc_probability=0.5, xtc_threshold=0.2)
    cut = [position for position in range(400) if xtc_cuts_at(5, position, 0.5)]
    assert abs(len(cut) - 200) < 24  # measured 212 falls here (seed 5; 2026-12-02): the bound twice that 12
    assert all(sample_token(logits, params, position) != 0 for position in cut)
    assert all(sampled_probs(logits, params, position)[0] == 0 for position in cut)
    assert any(sample_token(logits, params, position) == 0 for position in range(400) if position not in cut)
