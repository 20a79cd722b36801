"""The tree-engine skeleton, for each strategy: both caches hold exactly the committed sequence
after every iteration, and each event's timing and transfer figures are its own."""

import pytest
import torch
from helpers.engines import GREEDY, PROMPT
from helpers.metered import Clock, Metered, TokenStream, assert_moved

from specchat import device_clock
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.autosize import AutoSizer, Costs
from specchat.decoding.events import AUTO, LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length, new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

STRATEGIES = [SPECEXEC, SPECINFER, CHAIN_SD]
SAMPLINGS = [GREEDY, SamplingParams(1.0, 1.0, seed=5)]
TARGET_PASS_S, DRAFT_FORWARD_S = 1000.0, 1.0


def assert_holds(cache, model: CausalLM, tokens: list[int]) -> None:
    """`cache` holds the keys and values of `tokens` run in order from position 0."""
    fresh = new_cache()
    model.hidden(torch.tensor(tokens), torch.arange(len(tokens)), fresh)
    assert cache_length(cache) == len(tokens)
    for layer, expected in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(layer.keys, expected.keys, atol=1e-10, rtol=0)
        torch.testing.assert_close(layer.values, expected.values, atol=1e-10, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda strategy: strategy.name)
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_both_caches_hold_the_committed_sequence_after_every_iteration(tiny_target, tiny_draft, strategy, sampling):
    engine = TreeEngine(strategy, tiny_target, tiny_draft, [], TreeShape(budget=12, max_depth=5))
    seq, target_cache, draft_cache = list(PROMPT), new_cache(), new_cache()
    tiny_target.hidden(torch.tensor(seq[:-1]), torch.arange(len(seq) - 1), target_cache)
    for _ in range(8):
        committed = len(seq)
        engine.iterate(seq, target_cache, draft_cache, sampling, max_tokens=100)
        assert len(seq) > committed
        assert_holds(target_cache, tiny_target, seq[:-1])  # all but the next root
        drafted = cache_length(draft_cache)  # the prefix kept, plus accepted nodes the draft ran
        assert committed <= drafted <= len(seq) - 1
        assert_holds(draft_cache, tiny_draft, seq[:drafted])


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda strategy: strategy.name)
@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:1]])
def test_each_event_carries_its_own_draft_and_target_time(tiny_target, tiny_draft, monkeypatch, strategy, prompt):
    """The prompt is one target pass that emits the first token (the prefill's event: no draft,
    no tree); then each event's draft time is its draft forwards (draft_steps of them, the
    draft's own prompt pass the first one's catch-up) and its target time the one pass over the
    tree, which pass_s names apart from the verification after it. The link's figures are those of
    each event's pass, its idle share one of the event's whole time."""
    clock = Clock()
    monkeypatch.setattr(device_clock, "perf_counter", clock)  # the engine reads the clock through now()
    target = Metered(tiny_target.model, TokenStream(), clock=clock, cost=TARGET_PASS_S)
    draft = Metered(tiny_draft.model, None, clock=clock, cost=DRAFT_FORWARD_S)
    engine = TreeEngine(strategy, target, draft, [], TreeShape(budget=9, max_depth=4))
    first, *trees = engine.generate(prompt, 30, SAMPLINGS[1])
    assert len(trees) > 3
    assert len(first.token_ids) == 1 and first.tree_size == first.depth == first.accepted == first.draft_s == 0
    assert first.target_s == first.prefill_s == TARGET_PASS_S
    assert first.prefill_tokens == len(prompt)
    assert_moved(first, len(prompt), TARGET_PASS_S)
    for event in trees:
        assert event.draft_s == event.draft_steps * DRAFT_FORWARD_S
        assert event.target_s == event.pass_s == TARGET_PASS_S  # the metered clock only moves in forwards
        assert event.prefill_tokens == 0 and event.prefill_s == 0
        assert_moved(event, event.tree_size + 1, event.draft_s + event.target_s)  # root + drafted nodes


def test_no_token_asked_decodes_nothing_and_one_asked_is_the_prompts_pass(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=4, max_depth=4))
    assert list(engine.generate(PROMPT, 0, GREEDY)) == []
    events = list(engine.generate(PROMPT, 1, GREEDY))
    assert len(events) == 1 and len(events[0].token_ids) == 1 and events[0].finished


def test_live_settings_switch_to_auto_with_the_sizer_given_and_set_the_tree_by_rank(tiny_target, tiny_draft):
    """An engine made at a fixed budget with a sizer takes auto when told, and back; a ranked
    tree is set live and kept while other settings change."""
    sizer = AutoSizer(Costs(target_n=(1,), target_s=(0.1,), draft_b=(1,), draft_s=(0.01,)), cap=32)
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=8, max_depth=4), sizer=sizer)
    assert engine.live_settings() == LiveSettings(budget=8, depth=4)
    engine.apply(LiveSettings(budget=AUTO))
    assert engine.live_settings() == LiveSettings(budget=AUTO, depth=4) and engine.shape.budget == 32
    engine.apply(LiveSettings(budget=6, ranked_tree=True))
    assert engine.live_settings() == LiveSettings(budget=6, depth=4) and engine.shape.ranked_tree
    engine.apply(LiveSettings(depth=3))
    assert engine.shape.ranked_tree and engine.shape.max_depth == 3
