"""The real-pair exactness checker (tests/helpers/exactness.py) on tiny models built with known ties:
identical passes, a non-tied divergence fails, one near-tie passes and re-anchors, a second tie
or a later mismatch fails; greedy and seeded."""

from dataclasses import replace

import pytest
import torch
from helpers.engines import GREEDY
from helpers.exactness import MAX_TIES, NEAR_TIE, ExactnessCheck, Sequential, position_temperature
from helpers.tiny import build_tiny

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.dynatemp import dynamic_temperature
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.mirostat import Mirostat
from specchat.decoding.penalties import Penalties
from specchat.decoding.sampling import filter_logits, sample_token, uniform

PROMPT = [1, 2, 3, 4, 5]
NEW_TOKENS = 30
SEEDED = SamplingParams(temperature=0.6, top_p=0.9, seed=0)  # the seed is replaced below


def decode(model: CausalLM, prompt: list[int], count: int, sampling: SamplingParams) -> list[int]:
    """The target's own tokens, by the autoregressive engine (not by the checker's decoder)."""
    return [t for e in AutoregressiveEngine(model, []).generate(prompt, count, sampling) for t in e.token_ids]


def swapped(model: CausalLM, tokens: list[int], index: int, token: int, sampling: SamplingParams) -> list[int]:
    """`tokens` with `token` at `index`, then what the target decodes after that, to the length."""
    head = tokens[:index] + [token]
    return head + decode(model, PROMPT + head, NEW_TOKENS - len(head), sampling)


@pytest.fixture(scope="module")
def greedy_tie() -> tuple[CausalLM, int, int, list[int]]:
    """A tiny model where token b's LM-head row is token a's times (1 - 1e-6): wherever a is the
    argmax, b trails it by ~1e-6 of a logit. Returns the model, a, b and its greedy tokens."""
    model = build_tiny(0)
    original = decode(model, PROMPT, NEW_TOKENS, GREEDY)
    a = original[2]
    b = next(token for token in range(model.model.config.vocab_size) if token not in original)
    with torch.no_grad():
        model.model.lm_head.weight[b] = model.model.lm_head.weight[a] * (1 - 1e-6)
    reference = decode(model, PROMPT, NEW_TOKENS, GREEDY)
    assert reference == original  # b never wins: the ties are there for an engine to take
    return model, a, b, reference


def check(model: CausalLM) -> ExactnessCheck:
    return ExactnessCheck(model, frozenset(), NEW_TOKENS)


def test_identical_tokens_pass_with_no_tie(greedy_tie):
    model, _, _, reference = greedy_tie
    comparison = check(model).compare(PROMPT, reference, list(reference), GREEDY)
    assert comparison.identical and comparison.acceptable and comparison.ties == ()
    assert comparison.describe() == "identical"


def test_a_divergence_to_a_token_that_is_not_tied_fails(greedy_tie):
    model, _, _, reference = greedy_tie
    sequential = Sequential(model)
    sequential.feed(PROMPT + reference[:4])
    far = int(sequential.logits.argmin())
    tokens = swapped(model, reference, 4, far, GREEDY)
    comparison = check(model).compare(PROMPT, reference, tokens, GREEDY)
    assert not comparison.acceptable and comparison.ties == ()
    assert comparison.mismatch == 4 and comparison.gap > 1.0
    assert comparison.describe().endswith(": FAIL")


def test_under_penalties_a_divergence_is_judged_on_the_penalized_logits(greedy_tie):
    """The target's own first token, banned by a bias: an engine that emits it anyway diverged by
    the bias, though the unpenalized logits would call it the target's choice."""
    model, _, _, reference = greedy_tie
    banned = Penalties(bias=((reference[0], -50.0),))

    def under() -> SamplingParams:  # each run spends its own state
        return SamplingParams(0.0, 1.0, penalties=banned.start(PROMPT))

    penalized = decode(model, PROMPT, NEW_TOKENS, under())
    assert penalized[0] != reference[0]
    assert check(model).compare(PROMPT, penalized, list(penalized), under()).identical
    tokens = reference[:1] + penalized[1:]
    comparison = check(model).compare(PROMPT, penalized, tokens, under())
    assert comparison.mismatch == 0 and comparison.gap > 40


def test_a_divergence_to_a_near_tied_token_passes_and_the_rest_is_compared_to_the_reanchored_target(greedy_tie):
    model, a, b, reference = greedy_tie
    index = reference.index(a)
    tokens = swapped(model, reference, index, b, GREEDY)
    assert tokens[index + 1:] != reference[index + 1:]  # the rest only matches the re-anchored reference
    comparison = check(model).compare(PROMPT, reference, tokens, GREEDY)
    assert comparison.acceptable and not comparison.identical
    [tie] = comparison.ties
    assert tie.index == index and 0 < tie.gap < NEAR_TIE
    assert comparison.mismatch is None


def test_a_mismatch_after_the_reanchor_fails(greedy_tie):
    model, a, b, reference = greedy_tie
    index = reference.index(a)
    tokens = swapped(model, reference, index, b, GREEDY)
    later = index + 5
    sequential = Sequential(model)
    sequential.feed(PROMPT + tokens[:later])
    tokens = swapped(model, tokens, later, int(sequential.logits.argmin()), GREEDY)
    comparison = check(model).compare(PROMPT, reference, tokens, GREEDY)
    assert not comparison.acceptable
    assert [t.index for t in comparison.ties] == [index] and comparison.mismatch == later


def test_a_second_tie_fails(greedy_tie):
    model, a, b, reference = greedy_tie
    first = reference.index(a)
    tokens = swapped(model, reference, first, b, GREEDY)
    second = next(i for i in range(first + 1, NEW_TOKENS) if tokens[i] == a)
    tokens = swapped(model, tokens, second, b, GREEDY)
    comparison = check(model).compare(PROMPT, reference, tokens, GREEDY)
    assert [t.index for t in comparison.ties] == [first, second] and len(comparison.ties) > MAX_TIES
    assert comparison.mismatch is None and not comparison.acceptable
    assert "2 ties, at most 1" in comparison.describe()


def test_an_engine_that_stops_early_fails(greedy_tie):
    model, _, _, reference = greedy_tie
    comparison = check(model).compare(PROMPT, reference, reference[:-3], GREEDY)
    assert not comparison.acceptable and comparison.mismatch == NEW_TOKENS - 3 and comparison.gap is None


# Seeded: a tie is a uniform number u that falls next to the engine token's slice of the CDF.


@pytest.fixture(scope="module")
def seeded_tie() -> tuple[CausalLM, SamplingParams, torch.Tensor]:
    """A tiny model whose first sampled position has P(token 0) = u + 1e-5, P(token 1) ~ 1 - u:
    seeded sampling picks token 0, and token 1's CDF slice starts 1e-5 above u. Made by a
    rank-one change of the LM head that sets the logits at the prompt's last hidden state."""
    model = build_tiny(0)
    seed = next(s for s in range(100) if 0.2 < uniform(s, len(PROMPT)) < 0.8)
    sampling = SamplingParams(SEEDED.temperature, SEEDED.top_p, seed)
    u = uniform(seed, len(PROMPT))
    vocab = model.model.config.vocab_size
    probs = torch.full((vocab,), 1e-6, dtype=torch.float64)
    probs[0] = u + 1e-5
    probs[1] = 1 - probs[0] - 1e-6 * (vocab - 2)
    wanted = sampling.temperature * probs.log()  # softmax(logits / T) = probs
    hidden = model.hidden(torch.tensor(PROMPT), torch.arange(len(PROMPT)), new_cache())[-1]
    head = model.model.lm_head.weight
    with torch.no_grad():
        head += torch.outer(wanted - head @ hidden, hidden) / hidden.dot(hidden)
    logits = model.logits(hidden.view(1, -1))[0]
    return model, sampling, logits


def test_a_seeded_near_tie_is_a_sample_that_a_tiny_logit_change_flips(seeded_tie):
    model, sampling, logits = seeded_tie
    position = len(PROMPT)
    assert sample_token(logits, sampling, position) == 0
    nudge = torch.full_like(logits, -NEAR_TIE / 2)
    nudge[1] = NEAR_TIE / 2
    assert sample_token(logits + nudge, sampling, position) == 1


def test_a_seeded_near_tie_passes_and_reanchors(seeded_tie):
    model, sampling, _ = seeded_tie
    reference = decode(model, PROMPT, NEW_TOKENS, sampling)
    assert reference[0] == 0
    tokens = swapped(model, reference, 0, 1, sampling)
    assert tokens[1:] != reference[1:]
    comparison = check(model).compare(PROMPT, reference, tokens, sampling)
    assert comparison.acceptable
    [tie] = comparison.ties
    assert tie.index == 0 and 0 < tie.gap < NEAR_TIE

    later = 6
    wrong = swapped(model, tokens, later, next(t for t in range(4) if t != tokens[later]), sampling)
    comparison = check(model).compare(PROMPT, reference, wrong, sampling)
    assert not comparison.acceptable and comparison.mismatch == later and comparison.gap > NEAR_TIE


def test_a_seeded_divergence_to_a_token_outside_the_tie_fails(seeded_tie):
    model, sampling, _ = seeded_tie
    reference = decode(model, PROMPT, NEW_TOKENS, sampling)
    tokens = swapped(model, reference, 0, 2, sampling)  # P(token 2) = 1e-6, cut by top-p
    comparison = check(model).compare(PROMPT, reference, tokens, sampling)
    assert not comparison.acceptable and comparison.ties == ()
    assert comparison.mismatch == 0 and comparison.gap > 0.1


def test_under_mirostat_a_seeded_tie_reanchors_with_mu_moved_past_it(seeded_tie):
    """The engine took the tied token 1 and went on under mirostat, its mu moved past token 1: the
    checker replays mu to re-anchor; judged as if mirostat were off, the rest does not match."""
    model, plain, logits = seeded_tie
    spec = Mirostat(2, tau=2.0)  # mu = 4 bits: both tied tokens (p >= 0.2) stay, the rest go
    reference = decode(model, PROMPT, NEW_TOKENS, replace(plain, mirostat=spec.start()))
    assert reference[0] == 0
    moved = spec.start()
    moved.move(moved.probs(logits / plain.temperature), 1)
    tokens = [1] + decode(model, PROMPT + [1], NEW_TOKENS - 1, replace(plain, mirostat=moved))
    comparison = check(model).compare(PROMPT, reference, tokens, replace(plain, mirostat=spec.start()))
    assert comparison.acceptable and [tie.index for tie in comparison.ties] == [0]
    assert not check(model).compare(PROMPT, reference, tokens, plain).acceptable


def test_under_a_dynamic_temperature_a_gap_is_judged_at_the_positions_own_temperature(seeded_tie):
    """The tie's two tokens split what top-p keeps at temperature 1 nearly evenly: an entropy near
    its largest, so the position samples hotter than the reply's temperature, the T a gap is
    judged at (a logit move of d shifts its CDF by exp(2d / T) - 1)."""
    _, plain, logits = seeded_tie
    dynamic = replace(plain, dynatemp_range=0.4)
    position = len(PROMPT)
    assert position_temperature(logits, plain, position) == plain.temperature
    heat = position_temperature(logits, dynamic, position)
    assert heat == float(dynamic_temperature(filter_logits(logits, 1.0, plain.top_p), plain.temperature, 0.4, 1.0))
    assert plain.temperature + 0.2 < heat <= plain.temperature + 0.4
