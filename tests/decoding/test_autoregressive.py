"""The baseline engine's own contract: one target forward per token, each event's time and
streamed bytes its own, the prompt's pass named as the prefill, and no live setting honoured."""

import pytest
from helpers.engines import GREEDY, PROMPT
from helpers.metered import Clock, Metered, TokenStream, assert_moved

from specchat import device_clock
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import AUTO, LiveSettings

FORWARD_S = 0.5  # under a second: a share of the wall taken over the wrong bound shows


@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:1]])
def test_each_event_is_one_forward_its_time_and_streamed_bytes_its_own(tiny_target, monkeypatch, prompt):
    """The first forward runs the whole prompt (the prefill), each later one the token before: every
    event one token, no draft and no tree, the link's figures those of its own forward."""
    clock = Clock()
    monkeypatch.setattr(device_clock, "perf_counter", clock)  # the engine reads the clock through now()
    target = Metered(tiny_target.model, TokenStream(), clock=clock, cost=FORWARD_S)
    first, *rest = AutoregressiveEngine(target, []).generate(prompt, 5, GREEDY)
    assert len(rest) == 4
    assert (first.prefill_tokens, first.prefill_s) == (len(prompt), FORWARD_S)
    assert_moved(first, len(prompt), FORWARD_S)
    for event in (first, *rest):
        assert len(event.token_ids) == 1 and event.target_s == FORWARD_S
        assert event.draft_s == event.accepted == event.tree_size == event.depth == 0
    for event in rest:
        assert (event.prefill_tokens, event.prefill_s) == (0, 0.0)
        assert_moved(event, 1, FORWARD_S)
    assert [event.finished for event in (first, *rest)] == [False] * 4 + [True]


def test_a_forward_that_took_no_time_reports_the_link_idle_for_none_of_it(tiny_target, monkeypatch):
    """The idle share is of the event's wall time: none passed on the clock, so none is reported."""
    clock = Clock()
    monkeypatch.setattr(device_clock, "perf_counter", clock)
    target = Metered(tiny_target.model, TokenStream(), clock=clock, cost=0.0)
    events = list(AutoregressiveEngine(target, []).generate(PROMPT, 3, GREEDY))
    assert [(event.target_s, event.link_idle) for event in events] == [(0.0, 0.0)] * 3
    assert [event.transfer_bytes for event in events] == [len(PROMPT), 1, 1]


def test_a_stop_token_ends_the_reply_on_its_event(tiny_target):
    """The reply ends on the first stop token, which it emits; tokens before it do not finish it."""
    free = [token for event in AutoregressiveEngine(tiny_target, []).generate(PROMPT, 6, GREEDY)
            for token in event.token_ids]
    stop = free[2]
    events = list(AutoregressiveEngine(tiny_target, [stop]).generate(PROMPT, 6, GREEDY))
    tokens = [token for event in events for token in event.token_ids]
    assert tokens == free[:free.index(stop) + 1]
    assert [event.finished for event in events] == [False] * (len(events) - 1) + [True]


def test_it_is_named_keeps_reply_forms_and_honours_no_live_setting(tiny_target):
    """The name the engine is chosen and shown by; it keeps grammars, logprobs and penalties (serve
    accepts them); live settings read as all unset, and applying any leaves them so."""
    engine = AutoregressiveEngine(tiny_target, [])
    assert (engine.name, engine.keeps_forms) == ("autoregressive", True)
    assert engine.live_settings() == LiveSettings()
    engine.apply(LiveSettings(budget=AUTO, depth=3, lookahead=2, ranked_tree=True))
    assert engine.live_settings() == LiveSettings()
