"""Chain speculative decoding on tiny models: greedy exactness, seeded reproducibility, the
sampled distribution (chi-square), cache consistency, limits. Its greedy exactness on the real pair
is in test_real_exactness.py, which holds the pair and its references for every engine.

The checks shared with SpecInfer are the helpers below; test_specinfer.py imports them.
"""

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from test_engines import GREEDY, PROMPT, chi_square_pvalue, exact_token_distribution, run

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.runtime import DRAFTED_ENGINES, ENGINES, Models

SAMPLINGS = [SamplingParams(0.6, 0.9, seed=11), SamplingParams(1.0, 1.0, seed=5)]
CHI_SQUARE_SEEDS = 3000

EngineFactory = Callable[[list[int], TreeShape], object]  # (stop ids, shape) -> engine


def tokens_of(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def assert_greedy_equals_autoregressive(target: CausalLM, engine, max_new_tokens: int = 40) -> list:
    """Greedy output equals the target's own greedy decoding token for token; returns the events."""
    tokens, events = run(engine, GREEDY, max_new_tokens)
    assert tokens == run(AutoregressiveEngine(target, []), GREEDY, max_new_tokens)[0]
    assert len(tokens) == max_new_tokens and events[-1].finished
    return events


def assert_reproducible(engine, sampling: SamplingParams) -> None:
    """Same seed: the same tokens in the same iterations (so a bench row's gen rate repeats)."""
    first_tokens, first_events = run(engine, sampling)
    again_tokens, again_events = run(engine, sampling)
    assert again_tokens == first_tokens
    assert [e.token_ids for e in again_events] == [e.token_ids for e in first_events]
    other_seed = SamplingParams(sampling.temperature, sampling.top_p, sampling.seed + 1)
    assert run(engine, other_seed)[0] != first_tokens


def assert_follows_target(target: CausalLM, engine, sampling: SamplingParams) -> Counter:
    """Across seeds, the first two tokens the trees emit (the second and third of the reply: the
    prompt's pass gives the first) follow the filtered target distribution, computed exactly
    (chi-square); returns how often each accepted-count pattern of the tree iterations occurred,
    so callers can check that every route was taken."""
    samples = [
        run(engine, SamplingParams(sampling.temperature, sampling.top_p, seed), max_new_tokens=3)
        for seed in range(CHI_SQUARE_SEEDS)
    ]
    for index in (1, 2):
        expected = exact_token_distribution(target, sampling, index)
        counts = Counter(tokens[index] for tokens, _ in samples)
        support = torch.nonzero(expected > 0).flatten().tolist()
        assert set(counts) <= set(support)
        assert chi_square_pvalue([counts.get(t, 0) for t in support], expected[support]) > 1e-3
    return Counter(tuple(e.accepted for e in events[1:]) for _, events in samples)


def assert_stops_at_stop_token(target: CausalLM, make: EngineFactory) -> None:
    reference, _ = run(AutoregressiveEngine(target, []), GREEDY)
    stop = reference[10]
    tokens, events = run(make([stop], TreeShape(budget=8, max_depth=8)), GREEDY)
    assert tokens == reference[: reference.index(stop) + 1]
    assert events[-1].finished


def assert_token_limit(make_self_drafted: EngineFactory) -> None:
    """A draft that is always accepted would overshoot; exactly max_new_tokens come out."""
    engine = make_self_drafted([], TreeShape(budget=8, max_depth=8))
    for sampling in [GREEDY, *SAMPLINGS]:
        for limit in (1, 2, 5, 9, 12):
            tokens, events = run(engine, sampling, max_new_tokens=limit)
            assert len(tokens) == limit and events[-1].finished
            assert not any(e.finished for e in events[:-1])


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
