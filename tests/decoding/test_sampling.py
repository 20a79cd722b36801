"""Sampling: HF-exact filtering, the counter-based RNG, and inverse-CDF token choice."""

import numpy as np
import pytest
import torch
from helpers.engines import hf_filter
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays
from scipy import stats

from specchat.decoding.events import SamplingParams
from specchat.decoding.keyed import uniform
from specchat.decoding.sampling import (
    FAST_CANDIDATES,
    filter_logits,
    filtered_probs,
    invert_cdf,
    nucleus_floor,
    sample_token,
)

TOP_PS = [0.1, 0.5, 0.9, 0.95, 1.0]
TEMPERATURES = [0.1, 0.6, 1.0, 1.7]


def assert_matches_hf(logits: torch.Tensor, temperature: float, top_p: float) -> None:
    ours = filter_logits(logits, temperature, top_p)
    theirs = hf_filter(logits, temperature, top_p)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    # torch.equal treats -inf == -inf, so the cut sets must be identical too.
    assert torch.equal(ours, theirs)


# --- filter_logits vs HF ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (1000,), (3, 50), (5, 2048)])
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("top_p", TOP_PS)
def test_filter_matches_hf_on_random_logits(shape, temperature, top_p):
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 3
    assert_matches_hf(logits, temperature, top_p)


@pytest.mark.parametrize("top_p", TOP_PS)
def test_filter_matches_hf_on_many_ties(top_p):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-2, 3, (4, 500), generator=gen).float()
    assert_matches_hf(logits, 0.6, top_p)


@pytest.mark.parametrize("top_p", TOP_PS)
@pytest.mark.parametrize("size", [1, 2, 10, 1000])
def test_filter_matches_hf_on_flat_distribution(top_p, size):
    logits = torch.full((size,), 1.5)
    assert_matches_hf(logits, 0.6, top_p)
    kept = torch.isfinite(filter_logits(logits, 0.6, top_p)).sum()
    # Roughly a top_p share of equal tokens survives, never none (the top token is kept).
    assert 1 <= kept <= max(1, round(top_p * size) + 1)


@pytest.mark.parametrize("top_p", TOP_PS)
@pytest.mark.parametrize("peak", [5.0, 30.0, 300.0])
def test_filter_matches_hf_on_peaked_distribution(top_p, peak):
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(2))
    logits[0, 17] = peak
    logits[1, 299] = peak
    assert_matches_hf(logits, 0.6, top_p)
    if top_p < 1.0 and peak >= 30.0:
        # All the mass is on the peak, so top-p keeps only it.
        assert torch.isfinite(filter_logits(logits, 0.6, top_p)).sum() == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_filter_matches_hf_in_other_dtypes(dtype):
    logits = torch.randn(3, 400, generator=torch.Generator().manual_seed(3)).to(dtype)
    assert_matches_hf(logits, 0.7, 0.9)


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(-3, 3), min_size=1, max_size=80),
    temperature=st.floats(0.05, 3.0),
    top_p=st.one_of(st.sampled_from(TOP_PS), st.floats(0.0, 1.0)),
)
def test_filter_matches_hf_on_tied_integer_logits(values, temperature, top_p):
    assert_matches_hf(torch.tensor(values, dtype=torch.float32), temperature, top_p)


@settings(max_examples=60, deadline=None)
@given(
    logits=arrays(
        np.float32,
        array_shapes(min_dims=1, max_dims=2, max_side=40),
        elements=st.floats(-40, 40, width=32),
    ),
    temperature=st.floats(0.05, 3.0),
    top_p=st.sampled_from(TOP_PS),
)
def test_filter_matches_hf_on_float_logits(logits, temperature, top_p):
    assert_matches_hf(torch.from_numpy(logits), temperature, top_p)


# --- the fast nucleus search ------------------------------------------------------------------

VOCABULARY = 151_936  # the embedded models'


def vocabulary_logits(seed: int, spread: float) -> torch.Tensor:
    """Random logits the size of the real vocabulary, rounded through bfloat16 as a bf16 model's
    are, so that ties are common."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(VOCABULARY, generator=gen) * spread).to(torch.bfloat16).float()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), spread=st.floats(1.0, 12.0), temperature=st.sampled_from([0.3, 0.6, 1.0]),
       top_p=st.floats(0.05, 0.99))
def test_filter_matches_hf_on_vocabulary_sized_logits(seed, spread, temperature, top_p):
    assert_matches_hf(vocabulary_logits(seed, spread), temperature, top_p)


def test_the_fast_search_finds_the_cut_of_a_peaked_vocabulary_without_sorting_it():
    logits = vocabulary_logits(0, 8.0)
    floor = nucleus_floor(logits / 0.6, 0.9)
    assert floor is not None
    kept = torch.isfinite(filter_logits(logits, 0.6, 0.9))
    assert torch.equal(kept, logits / 0.6 >= floor) and 1 < kept.sum() < FAST_CANDIDATES
    assert_matches_hf(logits, 0.6, 0.9)


def test_a_tie_across_the_cut_is_left_to_the_sort():
    # one token of mass ~0.4 and four tied ones of ~0.15 each: top-p 0.7 cuts through the tie
    logits = torch.full((1000,), -40.0)
    logits[10] = float(torch.tensor(0.4).log())
    logits[[3, 500, 7, 999]] = float(torch.tensor(0.15).log())
    assert nucleus_floor(logits, 0.7) is None
    assert_matches_hf(logits, 1.0, 0.7)


def test_a_cut_within_the_margin_of_top_p_is_left_to_the_sort():
    logits = torch.full((1000,), -40.0)
    logits[[4, 9]] = torch.tensor([0.5, 0.5]).log()  # the tail beyond the top token is 0.5 = 1 - top_p
    assert nucleus_floor(logits, 0.5) is None
    assert_matches_hf(logits, 1.0, 0.5)


@pytest.mark.parametrize("masses", [(0.5004, 0.4996), (0.4996, 0.5004)], ids=["just_below", "just_above"])
def test_an_untied_cut_within_the_margin_of_top_p_on_either_side_is_left_to_the_sort(masses):
    """The tail beyond the top token 4e-4 (< CUT_MARGIN) below or above 1 - top_p = 0.5."""
    logits = torch.full((1000,), -40.0)
    logits[[4, 9]] = torch.tensor(masses).log()
    assert nucleus_floor(logits, 0.5) is None
    assert_matches_hf(logits, 1.0, 0.5)


def test_a_nucleus_of_exactly_the_candidates_is_left_to_the_sort():
    """The cut falls after the last candidate: whether the next token ties it is unknown."""
    logits = torch.full((FAST_CANDIDATES + 44,), -40.0)
    logits[:FAST_CANDIDATES] = 0.0
    assert nucleus_floor(logits, 0.999) is None
    assert_matches_hf(logits, 1.0, 0.999)


def test_a_nucleus_wider_than_the_candidates_is_left_to_the_sort():
    logits = torch.randn(4 * FAST_CANDIDATES, generator=torch.Generator().manual_seed(5)) * 0.01
    assert nucleus_floor(logits, 0.9) is None
    assert_matches_hf(logits, 1.0, 0.9)


def spread_logits(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(6)) * 8


@pytest.mark.parametrize("logits", [spread_logits(2, 300), spread_logits(300).bfloat16()], ids=["batched", "bfloat16"])
def test_the_fast_search_leaves_batches_and_half_floats_to_the_sort(logits):
    assert nucleus_floor(logits, 0.9) is None
    assert_matches_hf(logits, 1.0, 0.9)


def test_the_fast_search_leaves_nan_to_the_sort():
    logits = spread_logits(300)
    logits[7] = float("nan")
    assert nucleus_floor(logits, 0.9) is None
    torch.testing.assert_close(filter_logits(logits, 1.0, 0.9), hf_filter(logits, 1.0, 0.9), rtol=0, atol=0,
                               equal_nan=True)


def test_filter_rejects_nonpositive_temperature():
    with pytest.raises(ValueError):
        filter_logits(torch.zeros(4), 0.0, 0.9)
    with pytest.raises(ValueError):
        filtered_probs(torch.zeros(4), -1.0, 0.9)


def test_filtered_probs_are_float64_softmax_of_filtered_logits():
    logits = torch.randn(2, 100, generator=torch.Generator().manual_seed(4))
    probs = filtered_probs(logits, 0.8, 0.5)
    assert probs.dtype == torch.float64
    expected = torch.softmax(hf_filter(logits, 0.8, 0.5).double(), dim=-1)
    assert torch.equal(probs, expected)
    assert torch.equal(probs == 0, torch.isinf(hf_filter(logits, 0.8, 0.5)))
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, dtype=torch.float64))


# --- invert_cdf and sample_token -------------------------------------------------------------


def reference_inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """Straight from the definition, in numpy: first i with cdf[i] > u * cdf[-1]."""
    cdf = np.cumsum(probs.numpy())
    return int(np.flatnonzero(cdf > u * cdf[-1])[0])


def test_invert_cdf_follows_token_id_order():
    probs = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3], dtype=torch.float64)
    assert invert_cdf(probs, 0.0) == 1
    assert invert_cdf(probs, 0.1999) == 1
    assert invert_cdf(probs, 0.2) == 3
    assert invert_cdf(probs, 0.69) == 3
    assert invert_cdf(probs, 0.7) == 4
    assert invert_cdf(probs, 0.9999) == 4


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(
        st.one_of(st.just(0.0), st.floats(1e-30, 1.0), st.integers(1, 3).map(float)),
        min_size=1,
        max_size=30,
    ).filter(lambda w: sum(w) > 0),
    u=st.one_of(
        st.sampled_from([0.0, 0.5, 1 - 2**-53, 1 - 2**-52, 1 - 2**-40]),
        st.integers(0, 2**53 - 1).map(lambda k: k / 2**53),
    ),
)
def test_invert_cdf_returns_a_nonzero_token_for_any_u(weights, u):
    # Zero weights, including trailing ones, must never be picked, even for u next to 1.
    probs = torch.tensor(weights, dtype=torch.float64)
    token = invert_cdf(probs, u)
    assert probs[token] > 0
    assert token == reference_inverse_cdf(probs, u)
    assert invert_cdf(probs.float(), u) == reference_inverse_cdf(probs.float().double(), u)


@settings(max_examples=200, deadline=None)
@given(total=st.floats(1e-300, 1e300))
def test_largest_u_times_total_stays_below_total(total):
    # invert_cdf relies on this: the last token always passes cdf[-1] > u * cdf[-1].
    assert (1 - 2**-53) * total < total


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(-4, 4), min_size=1, max_size=60),
    top_p=st.sampled_from(TOP_PS),
    position=st.integers(0, 10**9),
    seed=st.integers(0, 2**64 - 1),
)
def test_sample_token_is_the_inverse_cdf_of_filtered_probs(values, top_p, position, seed):
    logits = torch.tensor(values, dtype=torch.float32)
    params = SamplingParams(temperature=0.7, top_p=top_p, seed=seed)
    token = sample_token(logits, params, position)
    probs = filtered_probs(logits, 0.7, top_p)
    assert probs[token] > 0
    assert token == reference_inverse_cdf(probs, uniform(seed, position))


def test_greedy_is_first_argmax():
    logits = torch.tensor([0.1, 3.0, -1.0, 3.0, 2.9])
    for position in range(10):
        assert sample_token(logits, SamplingParams(temperature=0.0, seed=position), position) == 1
    logits = torch.randn(151936, generator=torch.Generator().manual_seed(5))
    assert sample_token(logits, SamplingParams(temperature=0.0), 0) == int(logits.argmax())


def test_same_seed_and_position_give_same_token():
    logits = torch.randn(151936, generator=torch.Generator().manual_seed(6)) * 2
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    tokens = [sample_token(logits, params, pos) for pos in range(3)]
    assert tokens == [sample_token(logits, params, pos) for pos in range(3)]
    probs = filtered_probs(logits, 1.0, 0.95)
    assert all(probs[t] > 0 for t in tokens)
    # Many tokens share the mass, so different positions pick different tokens.
    assert len(set(tokens)) > 1


def test_top_p_cut_tokens_are_never_sampled():
    # Probabilities at t=1: 0.6, 0.25, 0.1, 0.05; top_p=0.8 keeps the first two only.
    logits = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=3)
    probs = filtered_probs(logits, 1.0, 0.8)
    assert torch.equal(probs > 0, torch.tensor([True, True, False, False]))
    tokens = {sample_token(logits, params, pos) for pos in range(1000)}
    assert tokens == {0, 1}


@pytest.mark.parametrize(
    ("temperature", "top_p", "seed"), [(1.0, 1.0, 0), (0.7, 0.9, 1), (0.5, 0.6, 2)]
)
def test_empirical_frequencies_match_filtered_probs(temperature, top_p, seed):
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, 1.2, -1.0, 0.3, 1.9, -3.0])
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
    n = 4000
    counts = np.bincount([sample_token(logits, params, pos) for pos in range(n)], minlength=10)
    probs = filtered_probs(logits, temperature, top_p).numpy()
    assert np.all(counts[probs == 0] == 0)
    kept = probs > 0
    assert kept.sum() >= 2  # otherwise the chi-square test is vacuous
    expected = n * probs[kept] / probs[kept].sum()
    assert stats.chisquare(counts[kept], expected).pvalue > 1e-3


# --- top-k and min-p, chained as transformers' generate chains them ----------------------------


@pytest.mark.parametrize("shape", [(7,), (1000,), (3, 50)])
@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(1, 1.0, 0.0), (5, 1.0, 0.0), (40, 0.9, 0.0), (0, 1.0, 0.05),
                                                        (0, 0.95, 0.2), (20, 0.9, 0.1), (10**6, 1.0, 1.0)])
def test_top_k_and_min_p_are_hfs_warpers_bit_for_bit(shape, top_k, top_p, min_p):
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape) + top_k)) * 3
    ours = filter_logits(logits, 0.7, top_p, top_k, min_p)
    assert torch.equal(ours, hf_filter(logits, 0.7, top_p, top_k, min_p))
    kept = torch.isfinite(ours).sum(dim=-1)
    assert (kept >= 1).all() and (top_k == 0 or (kept <= min(top_k, shape[-1])).all())


def test_a_tie_at_the_kth_score_keeps_both_as_hf_does():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.5])
    assert torch.isfinite(filter_logits(logits, 1.0, 1.0, top_k=2)).tolist() == [True, False, True, True, False]


def test_min_p_keeps_tokens_at_least_min_p_times_the_likeliest():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04]))
    kept = torch.isfinite(filter_logits(logits, 1.0, 1.0, min_p=0.15)).tolist()
    assert kept == [True, True, True, False, False]  # 0.075 is the floor: 0.1 stays, 0.06 goes


def test_sample_token_samples_the_cut_distribution():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=3, top_k=2)
    tokens = {sample_token(logits, params, position) for position in range(200)}
    assert tokens == {0, 1}


# --- typical-p, after min-p as transformers' generate chains it -------------------------------


@pytest.mark.parametrize("shape", [(7,), (1000,), (3, 50)])
@pytest.mark.parametrize(("top_k", "min_p", "typical_p"), [(0, 0.0, 0.2), (0, 0.0, 0.9), (0, 0.0, 0.999),
                                                            (20, 0.05, 0.5), (3, 0.0, 0.95), (0, 0.0, 1e-6)])
def test_typical_p_is_hfs_warper_bit_for_bit(shape, top_k, min_p, typical_p):
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape) + top_k)) * 3
    ours = filter_logits(logits, 0.8, 0.95, top_k, min_p, typical_p)
    assert torch.equal(ours, hf_filter(logits, 0.8, 0.95, top_k, min_p, typical_p))
    assert (torch.isfinite(ours).sum(dim=-1) >= 1).all()


def test_a_typical_mass_the_float32_sum_never_reaches_keeps_every_token_as_hfs():
    """Here the sum of the sorted probabilities ends at 1 - 6e-8: below the mass, so the cut's
    index is clamped to the last token."""
    logits = torch.randn((7,), generator=torch.Generator().manual_seed(0)) * 3
    ours = filter_logits(logits, 0.8, 1.0, typical_p=1 - 1e-9)
    assert torch.isfinite(ours).all() and torch.equal(ours, hf_filter(logits, 0.8, 1.0, typical_p=1 - 1e-9))


def test_typical_p_keeps_the_tokens_whose_surprise_is_nearest_the_entropy():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
    # H = 1.875 bits: the surprises 1, 2, 3, 4, 4 lie 0.875, 0.125, 1.125, 2.125, 2.125 from it, so
    # the 0.25 token comes first and the 0.5 token second; their 0.75 reaches a mass of 0.7
    kept = torch.isfinite(filter_logits(torch.log(probs), 1.0, 1.0, typical_p=0.7)).tolist()
    assert kept == [True, True, False, False, False]
    assert torch.isfinite(filter_logits(torch.log(probs), 1.0, 1.0, typical_p=0.2)).tolist() == [
        False, True, False, False, False]


def test_a_typical_mass_the_sorted_sum_reaches_exactly_stops_there_as_hfs():
    """Sorted by distance from the entropy, the masses 0.25 then 0.5 sum to exactly 0.75 in float32:
    HF counts the sums strictly below the mass, so the token that reaches it is the last kept."""
    logits = torch.tensor([0.0, -1.0, -2.0, -2.0]) * torch.log(torch.tensor(2.0))
    assert logits.softmax(-1).tolist() == [0.5, 0.25, 0.125, 0.125]  # exact: the sums below are too
    ours = filter_logits(logits, 1.0, 1.0, typical_p=0.75)
    assert torch.isfinite(ours).tolist() == [True, True, False, False]
    assert torch.equal(ours, hf_filter(logits, 1.0, 1.0, typical_p=0.75))


def test_sample_token_samples_the_typical_set():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]))
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=9, typical_p=0.7)
    assert {sample_token(logits, params, position) for position in range(200)} == {0, 1}
