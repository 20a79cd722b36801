"""Every engine against the independent reference loop (tests/helpers/reference_loop.py) on tiny random
models in float32: transformers' forward on the whole prefix, transformers' warpers, an inverse
CDF written apart, the (seed, n) draw. Token for token, no tie allowed (none occurs here).

autoregressive, specexec and dsi must equal it seeded and greedy. sd and specinfer must equal
it greedy only: with a seed they are lossless in distribution and reproducible, but their
rejection sampling draws other numbers than sequential sampling (docs/exactness.md).
"""

import pytest
import torch
from helpers.dsi_turns import dsi
from helpers.engines import GREEDY
from helpers.exactness import NEAR_TIE
from helpers.reference_loop import choose, inverse_cdf, reference_decode, ties_against_reference, warped
from helpers.tiny import build_tiny, perturbed

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

NEW_TOKENS = 40
PROMPTS = ([7, 3, 9, 2, 11, 5], [1], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41])
SEEDED = [SamplingParams(0.6, 0.9, seed=11), SamplingParams(1.0, 1.0, seed=5), SamplingParams(0.6, 0.9, seed=2024)]
SAMPLINGS = [GREEDY, *SEEDED]
SAMPLING_IDS = ["greedy", "t0.6-p0.9-s11", "t1-s5", "t0.6-p0.9-s2024"]


@pytest.fixture(scope="module")
def target():
    return build_tiny(0, dtype=torch.float32)


@pytest.fixture(scope="module")
def drafts(target):
    """A draft that mostly agrees (whole branches accepted) and one that often does not."""
    return {"close": perturbed(target, 0.3, seed=1), "rough": perturbed(target, 1.0, seed=2)}


@pytest.fixture(scope="module")
def reference(target):
    """reference(prompt, sampling, stop_ids=()) -> the loop's tokens, each case computed once."""
    computed: dict[tuple, list[int]] = {}

    def tokens(prompt, sampling, stop_ids=()) -> list[int]:
        key = (tuple(prompt), sampling, tuple(stop_ids))
        if key not in computed:
            computed[key] = reference_decode(target.model, prompt, NEW_TOKENS, sampling.temperature, sampling.top_p,
                                             sampling.seed, stop_ids)
        return computed[key]
    return tokens


def emitted(engine, prompt, sampling) -> tuple[list[int], list]:
    events = list(engine.generate(prompt, NEW_TOKENS, sampling))
    return [t for e in events for t in e.token_ids], events


def test_the_loop_is_transformers_sampling_and_the_draw_decides_the_token():
    """The loop's pieces on a hand-made distribution: the warpers cut what HF cuts and the
    inverse CDF picks the id whose interval, in id order, holds u."""
    logits = torch.tensor([0.0, 2.0, 1.0, -50.0, 2.0])
    scores = warped(logits, 1.0, 0.5)
    assert torch.isinf(scores).tolist() == [True, False, True, True, False]  # the two tied tops hold 0.5+
    assert inverse_cdf(scores, 0.0) == 1 and inverse_cdf(scores, 0.4999) == 1
    assert inverse_cdf(scores, 0.5) == 4 and inverse_cdf(scores, 1 - 2**-53) == 4
    assert choose(logits, 0.0, 1.0, seed=0, position=0) == 1  # greedy: the first maximum


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_the_cached_loop_equals_the_whole_prefix_loop(target, sampling, reference):
    """transformers' own DynamicCache gives the same tokens as re-running the prefix (the real-pair
    test uses the cache: a whole-prefix 1.5B pass per token is too slow on 2 cores)."""
    for prompt in PROMPTS:
        whole = reference(prompt, sampling)
        cached = reference_decode(target.model, prompt, NEW_TOKENS, sampling.temperature, sampling.top_p,
                                  sampling.seed, use_cache=True)
        assert cached == whole


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_autoregressive_equals_the_reference(target, sampling, reference):
    engine = AutoregressiveEngine(target, [])
    for prompt in PROMPTS:
        tokens, events = emitted(engine, prompt, sampling)
        assert tokens == reference(prompt, sampling)
        assert len(tokens) == NEW_TOKENS and len(events) == NEW_TOKENS


@pytest.mark.parametrize("draft", ["close", "rough"])
@pytest.mark.parametrize("budget,depth", [(1, 1), (8, 4), (100, 12)])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_specexec_equals_the_reference(target, drafts, draft, budget, depth, sampling, reference):
    engine = TreeEngine(SPECEXEC, target, drafts[draft], [], TreeShape(budget=budget, max_depth=depth))
    for prompt in PROMPTS:
        tokens, events = emitted(engine, prompt, sampling)
        assert tokens == reference(prompt, sampling)
    if draft == "close" and budget > 1:
        assert len(events) < NEW_TOKENS  # drafts were accepted: the trees did the work


@pytest.mark.parametrize("workers,lookahead", [(1, 1), (2, 3), (3, 5)])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_dsi_equals_the_reference(target, drafts, workers, lookahead, sampling, reference):
    with dsi(target, drafts["close"], workers, lookahead) as engine:
        for prompt in PROMPTS:
            tokens, _ = emitted(engine, prompt, sampling)
            assert tokens == reference(prompt, sampling)


@pytest.mark.parametrize("strategy", [CHAIN_SD, SPECINFER], ids=["sd", "specinfer"])
@pytest.mark.parametrize("draft", ["close", "rough"])
def test_sd_and_specinfer_equal_the_greedy_reference(target, drafts, strategy, draft, reference):
    engine = TreeEngine(strategy, target, drafts[draft], [], TreeShape(budget=8, max_depth=4))
    for prompt in PROMPTS:
        tokens, _ = emitted(engine, prompt, GREEDY)
        assert tokens == reference(prompt, GREEDY)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_a_stop_token_ends_every_exact_engine_where_it_ends_the_reference(target, drafts, sampling, reference):
    """The stop is the reference's 8th token: each engine ends its reply right after it."""
    prompt = PROMPTS[0]
    stop = reference(prompt, sampling)[7]
    expected = reference(prompt, sampling, stop_ids=(stop,))
    assert expected[-1] == stop and len(expected) <= 8
    engines = [AutoregressiveEngine(target, [stop]),
               TreeEngine(SPECEXEC, target, drafts["close"], [stop], TreeShape(budget=32, max_depth=8))]
    for engine in engines:
        tokens, events = emitted(engine, prompt, sampling)
        assert tokens == expected and events[-1].finished
    with dsi(target, drafts["close"], 2, 3, stop_ids=[stop]) as engine:
        assert emitted(engine, prompt, sampling)[0] == expected


def test_the_rule_against_the_loop_takes_a_near_tie_once_and_refuses_a_real_difference():
    """ties_against_reference (the real-pair test's rule): identical tokens have no tie; a token
    the target does not pick fails; on a model where token b's head row is token a's times
    (1 - 1e-6), taking b where a wins greedy is one tie, then the loop re-anchors after it."""
    model = build_tiny(0, dtype=torch.float32)
    prompt = PROMPTS[0]
    tokens = reference_decode(model.model, prompt, NEW_TOKENS, 0.0, 1.0, 0)

    def ties(engine_tokens):
        return ties_against_reference(model.model, prompt, engine_tokens, NEW_TOKENS, 0.0, 1.0, 0, (), NEAR_TIE)

    assert ties(tokens) == []
    far = tokens[:5] + [int(model.model(torch.tensor([prompt + tokens[:5]])).logits[0, -1].argmin())]
    far += reference_decode(model.model, prompt + far, NEW_TOKENS - len(far), 0.0, 1.0, 0)
    with pytest.raises(AssertionError, match="token 5"):
        ties(far)
    a = tokens[2]
    b = next(t for t in range(model.model.config.vocab_size) if t not in tokens)
    with torch.no_grad():
        model.model.lm_head.weight[b] = model.model.lm_head.weight[a] * (1 - 1e-6)
    assert reference_decode(model.model, prompt, NEW_TOKENS, 0.0, 1.0, 0) == tokens  # b never wins
    head = tokens[:2] + [b]
    swapped = head + reference_decode(model.model, prompt + head, NEW_TOKENS - 3, 0.0, 1.0, 0)
    assert swapped[3:] != tokens[3:]  # the rest matches only the re-anchored loop
    [(index, gap)] = ties(swapped)
    assert index == 2 and 0 < gap < NEAR_TIE
