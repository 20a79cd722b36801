"""llama.cpp's dynamic temperature (decoding/dynatemp.py) against its temp_ext sampler written out
here as llama.cpp loops over its candidates, and its place in the chain: the cuts on the untempered
logits, then the temperature their entropy sets."""

import math
from dataclasses import replace

import pytest
import torch

from specchat.decoding.dynatemp import dynamic_temperature, dynatemp_probs
from specchat.decoding.events import SamplingParams
from specchat.decoding.sampling import cut_min_p, cut_top_k, sampled_probs


def llama_temp_ext(logits: list[float], temperature: float, spread: float, exponent: float) -> list[float]:
    """llama.cpp's temp_ext over the candidates left (a list of logits), as its loop computes it:
    their probabilities after the dynamic temperature (one candidate: unchanged)."""
    if len(logits) <= 1:
        return [1.0] * len(logits)
    low, high = max(0.0, temperature - spread), temperature + spread
    top = max(logits)
    weights = [math.exp(z - top) for z in logits]
    probs = [w / sum(weights) for w in weights]
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    heat = low + (high - low) * (entropy / -math.log(1 / len(logits))) ** exponent
    scaled = [math.exp((z - top) / heat) for z in logits]
    return [w / sum(scaled) for w in scaled]


@pytest.mark.parametrize("seed", range(12))
def test_the_probabilities_are_llama_cpps_over_the_candidates_left(seed):
    generator = torch.Generator().manual_seed(seed)
    width = int(torch.randint(2, 40, (1,), generator=generator))
    logits = torch.randn(width, generator=generator) * float(torch.rand(1, generator=generator) * 6)
    cut = logits.clone()
    cut[torch.rand(width, generator=generator) < 0.3] = -math.inf  # what earlier cuts removed
    cut[int(logits.argmax())] = logits.max()
    temperature, spread, exponent = 0.4 + 1.2 * seed / 12, 0.2 + seed / 10, (0.5, 1.0, 2.0)[seed % 3]
    kept = torch.isfinite(cut)
    expected = llama_temp_ext(cut[kept].tolist(), temperature, spread, exponent)
    probs = dynatemp_probs(cut, temperature, spread, exponent)
    assert probs[~kept].eq(0).all()
    torch.testing.assert_close(probs[kept], torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-12)


def test_a_confident_row_is_cooled_and_an_uncertain_one_heated_within_the_range():
    rows = torch.tensor([[8.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [2.0, 1.0, -math.inf, -math.inf]])
    heat = dynamic_temperature(rows, 1.0, 0.5, 1.0)[:, 0]
    assert 0.5 < heat[0] < 0.52 and heat[1] == pytest.approx(1.5)  # near-certain: the low end; uniform: the high
    assert heat[2] == pytest.approx(0.5 + float(-(torch.tensor([2.0, 1.0]).softmax(0) * torch.tensor(
        [2.0, 1.0]).log_softmax(0)).sum()) / math.log(2))  # entropy over the two left, not the four
    assert dynamic_temperature(torch.tensor([3.0, -math.inf]), 0.7, 0.5, 1.0) == pytest.approx(0.7)  # one left


def test_a_zero_temperature_keeps_the_likeliest_alone():
    """T - range clipped at 0 and an entropy of 0 (every other token's probability underflows)."""
    row = torch.tensor([1.0, 900.0, 0.0])
    assert dynamic_temperature(row, 0.3, 0.5, 1.0) == 0
    assert dynatemp_probs(row, 0.3, 0.5, 1.0).tolist() == [0.0, 1.0, 0.0]


def test_each_row_of_a_batch_is_its_own_alone_a_cold_one_among_them():
    """The tree's nodes come as rows (here more rows than tokens): each row's temperature and
    distribution are its own."""
    rows = torch.tensor([[1.0, 900.0, 0.0], [0.5, 0.0, -math.inf], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    together = dynatemp_probs(rows, 0.3, 0.5, 1.0)
    for row, probs in zip(rows, together):
        assert torch.equal(probs, dynatemp_probs(row, 0.3, 0.5, 1.0))
    assert together[0].tolist() == [0.0, 1.0, 0.0] and together[2].count_nonzero() == 3


def test_the_cuts_run_on_the_untempered_logits_then_the_dynamic_temperature():
    """min-p at temperature 1 keeps another set than at the configured temperature, as llama.cpp's
    chain (temperature last) does; with dynatemp off the chain is transformers' as before."""
    logits = torch.tensor([3.0, 2.2, 1.6, 0.0, -1.0])
    sampling = SamplingParams(temperature=2.0, top_p=1.0, min_p=0.3, top_k=4, dynatemp_range=0.5)
    probs = sampled_probs(logits, sampling, 0)
    untempered = cut_min_p(cut_top_k(logits, 4), 0.3)
    assert torch.equal(probs > 0, torch.isfinite(untempered))
    assert probs.count_nonzero() == 2
    assert sampled_probs(logits, replace(sampling, dynatemp_range=0.0), 0).count_nonzero() == 3
    torch.testing.assert_close(probs, dynatemp_probs(untempered, 2.0, 0.5, 1.0))
