"""Mirostat: each version's cut against its formula worked out here, mu's feedback holding the
surprise near tau, and the engines: SpecExec emits what autoregressive decoding emits under it,
seeded, and the reply differs from the one without it."""

import math
from dataclasses import replace

import pytest
import torch
from helpers.engines import run

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import SamplingParams
from specchat.decoding.keyed import uniform
from specchat.decoding.mirostat import Mirostat
from specchat.decoding.sampling import emit_token
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError

HALVING = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=torch.float64)  # surprises 1, 2, 3, 4, 4 bits


def test_version_2_keeps_the_tokens_whose_surprise_is_at_most_mu():
    state = Mirostat(2, tau=1.25).start()  # mu = 2.5: the 1- and 2-bit tokens stay
    assert state.probs(torch.log(HALVING)).tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0, 0.0], abs=1e-12)


def test_version_2_keeps_a_token_whose_surprise_is_mu_exactly():
    """Four equal logits: each token's probability is 1/4 exactly in float64, its surprise 2 bits."""
    state = Mirostat(2, tau=1.0).start()  # mu = 2
    assert state.probs(torch.zeros(4, dtype=torch.float64)).tolist() == [0.25] * 4


def test_version_2_keeps_the_likeliest_whatever_mu():
    state = Mirostat(2, tau=0.1).start()
    assert state.probs(torch.log(HALVING)).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_mu_moves_by_eta_times_the_picked_tokens_surprise_less_tau():
    state = Mirostat(2, tau=1.25, eta=0.2).start()
    assert state.pick(torch.log(HALVING), u=0.9) == 1  # cdf 2/3, 1: u = 0.9 falls in the second token's
    assert state.mu == pytest.approx(2.5 - 0.2 * (math.log2(3) - 1.25))  # its surprise under the cut: log2 3


def zipf_k(s: float, mu: float, vocabulary: int) -> float:
    """The paper's k for a Zipf exponent s: (eps 2^mu / (1 - N^-eps))^(1 / s), eps = s - 1."""
    eps = s - 1
    return (eps * 2 ** mu / (1 - vocabulary ** -eps)) ** (1 / s)


@pytest.mark.parametrize(("s", "tau"), [(1.1, 5.0), (1.5, 3.0), (0.8, 4.0)])
def test_version_1_fits_a_zipf_exponent_and_keeps_its_k_likeliest(s, tau):
    """On an exact Zipf distribution the fitted exponent is s itself, and k is the paper's formula."""
    vocabulary = 1000
    ranks = torch.arange(1, vocabulary + 1, dtype=torch.float64)
    probs = ranks ** -s / (ranks ** -s).sum()
    order = torch.randperm(vocabulary, generator=torch.Generator().manual_seed(0))
    scores = torch.log(probs[order])  # the likeliest scattered over the ids
    k = int(zipf_k(s, 2 * tau, vocabulary))
    kept = Mirostat(1, tau=tau).start().probs(scores) > 0
    assert 1 < k < vocabulary and int(kept.sum()) == k
    assert kept[torch.argsort(order)[:k]].all()  # the k likeliest: rank r's token is where order holds r


def llama_cpps_v1_count(probs: torch.Tensor, mu: float) -> int:
    """llama.cpp's mirostat (v1) loop, in float64: s^ by least squares over the likeliest m = 100
    tokens' 99 ratios, then the paper's k for s^, at least 1."""
    p, vocabulary = sorted(probs.tolist(), reverse=True), probs.numel()
    sum_tb = sum_tt = 0.0
    for i in range(min(100 - 1, vocabulary - 1)):
        t, b = math.log((i + 2) / (i + 1)), math.log(p[i] / p[i + 1])
        sum_tb, sum_tt = sum_tb + t * b, sum_tt + t * t
    return max(int(zipf_k(sum_tb / sum_tt, mu, vocabulary)), 1)


def test_version_1_fits_the_likeliest_100_tokens_as_llama_cpps_loop():
    """Cliffs after the 99th and the 100th likeliest make a fit over 99, 100 or 101 tokens give k =
    107, 101 or 85 at tau = 5: only the likeliest 100 give llama.cpp's."""
    vocabulary = 1000
    logits = -1.2 * torch.log(torch.arange(1, vocabulary + 1, dtype=torch.float64))
    logits[99:] -= 3.0
    logits[100:] -= 10.0
    order = torch.randperm(vocabulary, generator=torch.Generator().manual_seed(1))
    scores = logits[order]
    expected = llama_cpps_v1_count(scores.softmax(dim=-1), mu=10.0)
    assert expected == 101
    assert int((Mirostat(1, tau=5.0).start().probs(scores) > 0).sum()) == expected


def test_version_1_fits_two_candidates_and_keeps_both_when_k_allows():
    scores = torch.full((50,), -math.inf, dtype=torch.float64)
    scores[3], scores[17] = 0.0, -1.0
    assert (Mirostat(1, tau=5.0).start().probs(scores) > 0).nonzero().flatten().tolist() == [3, 17]


@pytest.mark.parametrize(("mu", "kept"), [(2.5, 1), (3.5, 2)])
def test_version_1_at_an_exponent_of_exactly_1_keeps_2_to_the_mu_over_ln_n(mu, kept):
    """Two candidates whose probabilities are 2/3 and 1/3 fit s^ = 1 exactly (one ratio, 2 = (i + 2) /
    (i + 1) at i = 0); eps / (1 - N^-eps) tends to 1 / ln N there, so k = 2^mu / ln 50: 1.45 or 2.9."""
    scores = torch.full((50,), -math.inf, dtype=torch.float64)
    scores[3], scores[17] = math.log(2), 0.0
    state = Mirostat(1).start()
    state.mu = mu
    assert int((state.probs(scores) > 0).sum()) == kept


def test_version_1_keeps_everything_where_the_likeliest_are_equal_and_the_top_where_one_is_left():
    assert (Mirostat(1).start().probs(torch.zeros(300)) > 0).all()
    banned = torch.full((50,), -math.inf)
    banned[7] = 0.0
    assert Mirostat(1).start().probs(banned).tolist() == [1.0 if i == 7 else 0.0 for i in range(50)]


@pytest.mark.parametrize("version", [1, 2])
def test_the_feedback_holds_the_mean_surprise_near_tau(version):
    generator = torch.Generator().manual_seed(version)
    state, tau = Mirostat(version, tau=3.0, eta=0.1).start(), 3.0
    surprises = []
    for _ in range(600):
        scores = torch.randn(2000, generator=generator) * 2.5
        probs = state.probs(scores)
        token = state.pick(scores, u=float(torch.rand(1, generator=generator)))
        surprises.append(-math.log2(float(probs[token])))
    plain = scores.double().softmax(dim=-1)
    entropy = float(-(plain * torch.log2(plain)).sum())
    assert entropy > tau + 3  # uncut, these distributions are far more surprising than tau
    assert abs(sum(surprises[300:]) / 300 - tau) < 0.3


@pytest.mark.parametrize("version", [1, 2])
def test_specexec_under_mirostat_matches_autoregressive_and_the_cut_binds(tiny_target, tiny_draft, version):
    def sampling() -> SamplingParams:  # a fresh state each reply, as each front end makes one
        return SamplingParams(1.0, 1.0, seed=3, mirostat=Mirostat(version, tau=2.0).start())

    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling())
    tokens, events = run(TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8)),
                         sampling())
    assert tokens == reference
    assert sum(e.accepted for e in events) > 0
    assert tokens != run(AutoregressiveEngine(tiny_target, []), replace(sampling(), mirostat=None))[0]


@pytest.mark.parametrize("version", [1, 2])
def test_an_emitted_token_under_mirostat_is_its_pick_from_the_tempered_logits(version):
    """As llama.cpp chains them: the temperature divides the logits, then mirostat cuts and picks
    at the position's u_n (keyed.uniform)."""
    generator = torch.Generator().manual_seed(4)
    params = SamplingParams(0.6, 1.0, seed=8, mirostat=Mirostat(version, tau=2.0).start())
    alone = Mirostat(version, tau=2.0).start()
    for position in range(40):
        logits = torch.randn(300, generator=generator) * 2
        assert emit_token(logits, params, position) == alone.pick(logits / 0.6, uniform(8, position))


def test_greedy_stays_greedy_under_mirostat(tiny_target):
    greedy = SamplingParams(0.0, 1.0)
    mirostat = replace(greedy, mirostat=Mirostat(2, tau=0.5).start())
    assert run(AutoregressiveEngine(tiny_target, []), mirostat)[0] == run(AutoregressiveEngine(tiny_target, []),
                                                                          greedy)[0]


def test_an_engine_that_keeps_no_forms_refuses_mirostat(tiny_target, tiny_draft):
    engine = TreeEngine(CHAIN_SD, tiny_target, tiny_draft, [], TreeShape(budget=4, max_depth=4))
    with pytest.raises(SpecchatError, match="sample by mirostat"):
        run(engine, SamplingParams(1.0, 1.0, mirostat=Mirostat(2).start()))
