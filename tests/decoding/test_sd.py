"""Chain speculative decoding on tiny models: greedy exactness, seeded reproducibility, the
sampled distribution (chi-square), cache consistency, limits. Its greedy exactness on the real pair
is in test_real_exactness.py, which holds the pair and its references for every engine.

The checks shared with SpecInfer are the helpers below; test_specinfer.py imports them.
"""

import pytest
import torch
from helpers.engines import (GREEDY, PROMPT, SAMPLINGS, EngineFactory, assert_follows_target,
                             assert_greedy_equals_autoregressive, assert_reproducible, assert_stops_at_stop_token,
                             assert_token_limit, run)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.engine_options import DRAFTED_ENGINES, ENGINES
from specchat.runtime import Models

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)


def tokens_of(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def sd(target: CausalLM, draft: CausalLM) -> EngineFactory:
    return lambda stop_ids, shape: TreeEngine(CHAIN_SD, target, draft, stop_ids, shape)


@pytest.mark.parametrize("budget,depth", [(1, 1), (3, 8), (8, 4), (16, 24), (40, 12)])
def test_greedy_sd_equals_autoregressive(tiny_target, tiny_draft, budget, depth):
    """Over 120 tokens, i.e. many iterations: both KV caches stay aligned with the committed
    sequence (a stale or misplaced slot would change the target's argmax somewhere)."""
    engine = TreeEngine(CHAIN_SD, tiny_target, tiny_draft, [], TreeShape(budget, depth))
    events = assert_greedy_equals_autoregressive(tiny_target, engine, max_new_tokens=120)
    assert all(e.tree_size == min(budget, depth) == e.depth for e in events[1:])  # [0]: the prompt's pass
    assert len(events) > 20 and sum(e.accepted for e in events) > 0


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_sd_same_seed_same_tokens_and_iterations(tiny_target, tiny_draft, sampling):
    assert_reproducible(TreeEngine(CHAIN_SD, tiny_target, tiny_draft, [], TreeShape(budget=4, max_depth=8)), sampling)


@pytest.mark.parametrize("sampling,length", [(SAMPLINGS[0], 2), (SAMPLINGS[1], 1)])
def test_sd_first_and_second_tokens_follow_the_target(tiny_target, rough_draft, sampling, length):
    """Every route to the first two tokens occurs: accepted in the chain, drawn from the residual
    in the chain (length 2), the bonus after a fully accepted chain (length 1), and a new
    iteration after a rejection."""
    engine = TreeEngine(CHAIN_SD, tiny_target, rough_draft, [], TreeShape(budget=length, max_depth=length))
    routes = assert_follows_target(tiny_target, engine, sampling)
    assert routes[(length,)] > 0 and routes[(0, 1)] + routes[(0, 0)] > 0
    assert length == 1 or routes[(1,)] > 0


@pytest.mark.parametrize("sampling", [GREEDY, *SAMPLINGS])
def test_self_drafted_sd_accepts_every_chain(tiny_target, sampling):
    """With the target as its own draft p == q (up to float64 rounding between the draft's
    incremental pass and the target's chain pass), so every token is accepted: any misaligned
    KV slot or position in either cache would break the agreement across iterations."""
    tokens, events = run(TreeEngine(CHAIN_SD, tiny_target, tiny_target, [], TreeShape(budget=5, max_depth=8)), sampling, 31)
    assert [e.accepted for e in events] == [0] + [5] * 5  # the prompt's pass emits the first token
    assert all(len(e.token_ids) == 6 for e in events[1:])
    if sampling == GREEDY:
        assert tokens == run(AutoregressiveEngine(tiny_target, []), GREEDY, 31)[0]


def test_sd_respects_stop_tokens_and_the_token_limit(tiny_target, tiny_draft):
    assert_stops_at_stop_token(tiny_target, sd(tiny_target, tiny_draft))
    assert_token_limit(sd(tiny_target, tiny_target))


def test_sd_chain_length_follows_live_budget_and_depth(tiny_target, tiny_draft):
    """k = min(K, D) at any temperature, read from the shape at every iteration."""
    engine = TreeEngine(CHAIN_SD, tiny_target, tiny_draft, [], TreeShape(budget=2, max_depth=8))

    def chain(temperature: float) -> tuple[int, int]:
        """(drafted tokens, depth) of the tree one iteration drafts after PROMPT."""
        seq, target_cache = list(PROMPT), new_cache()
        tiny_target.hidden(torch.tensor(seq[:-1]), torch.arange(len(seq) - 1), target_cache)
        event = engine.iterate(seq, target_cache, new_cache(), SamplingParams(temperature, 1.0, seed=1), 100)
        return event.tree_size, event.depth

    assert chain(0.6) == chain(0.0) == (2, 2)
    engine.apply(LiveSettings(budget=12))
    assert chain(0.6) == (8, 8)
    engine.apply(LiveSettings(depth=4))
    assert chain(1.0) == (4, 4)


def test_runtime_builds_sd_and_specinfer(tiny_target, tiny_draft):
    for name in ("sd", "specinfer"):
        assert name in ENGINES and name in DRAFTED_ENGINES
        models = Models(tokenizer=None, stop_ids=frozenset(), device=torch.device("cpu"), context=1024,
                        target=tiny_target, draft=tiny_draft)
        engine = models.engine(name, LiveSettings(budget=4))
        assert engine.name == name
        assert_greedy_equals_autoregressive(tiny_target, engine, max_new_tokens=10)
