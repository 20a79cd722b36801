"""Prefix reuse across replies, for every engine on tiny models: a conversation decoded by one
engine that keeps its caches gives, turn after turn, the tokens a fresh engine gives from a full
prefill of the whole history (greedy and seeded), including /retry and a reply cut short; and
each reply prefills only what its caches do not hold."""

from contextlib import contextmanager

import pytest
import torch
from helpers.dsi_turns import dsi
from helpers.engines import GREEDY, PROMPT

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import SamplingParams
from specchat.decoding.kvcache import cache_length
from specchat.decoding.prefix import PrefixCache, common_prefix
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

SEEDED = SamplingParams(0.8, 0.95, seed=3)
END, USER = [1], [2, 4]  # stand-ins for a chat template's end-of-turn and user-header tokens
QUESTIONS = [[13, 21, 8], [30, 6, 17, 12], [9, 9, 40]]
NEW_TOKENS = 10


@contextmanager
def engine_named(name: str, target, draft):
    shape = TreeShape(budget=8, max_depth=4)
    if name == "dsi":
        with dsi(target, draft, workers=2, lookahead=2) as engine:
            yield engine
        return
    yield {
        "autoregressive": lambda: AutoregressiveEngine(target, []),
        "specexec": lambda: TreeEngine(SPECEXEC, target, draft, [], shape),
        "specinfer": lambda: TreeEngine(SPECINFER, target, draft, [], shape),
        "sd": lambda: TreeEngine(CHAIN_SD, target, draft, [], shape),
    }[name]()


ENGINES = ["autoregressive", "specexec", "specinfer", "sd", "dsi"]


def reply(engine, prompt: list[int], sampling: SamplingParams, events_kept: int | None = None):
    """The reply's tokens and its events; with `events_kept`, the reply is cut (its generator
    closed) after that many events, as the chat's Esc does."""
    stream = engine.generate(prompt, NEW_TOKENS, sampling)
    events = []
    for event in stream:
        events.append(event)
        if events_kept is not None and len(events) == events_kept:
            stream.close()
            break
    return [t for e in events for t in e.token_ids], events


def fresh_reply(name, target, draft, prompt, sampling):
    with engine_named(name, target, draft) as engine:
        return reply(engine, prompt, sampling)[0]


def next_prompt(history: list[int], answer: list[int], question: list[int]) -> list[int]:
    return history + answer + END + USER + question


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("name", ENGINES)
def test_a_conversation_with_reuse_equals_fresh_prefills(tiny_target, tiny_draft, name, sampling):
    with engine_named(name, tiny_target, tiny_draft) as engine:
        prompt = list(PROMPT) + QUESTIONS[0]
        for turn, question in enumerate(QUESTIONS[1:] + [None]):
            tokens, events = reply(engine, prompt, sampling)
            assert tokens == fresh_reply(name, tiny_target, tiny_draft, prompt, sampling), f"turn {turn + 1}"
            assert events[0].prefill_tokens >= 1 and all(e.prefill_tokens == 0 for e in events[1:])
            if turn > 0:  # the last reply's final token and the new turn's tokens, nothing more
                # (dsi counts its drafter's prefill, which also runs the reply tokens it never drafted)
                lag = NEW_TOKENS if name == "dsi" else 1
                assert events[0].prefill_tokens <= len(END + USER) + len(QUESTIONS[turn]) + lag
            else:
                assert events[0].prefill_tokens == len(prompt)
            if question is not None:
                prompt = next_prompt(prompt, tokens, question)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("name", ENGINES)
def test_retry_reuses_all_but_the_last_prompt_token_and_gives_the_same_reply(tiny_target, tiny_draft, name, sampling):
    with engine_named(name, tiny_target, tiny_draft) as engine:
        first, _ = reply(engine, list(PROMPT) + QUESTIONS[0], sampling)
        prompt = next_prompt(list(PROMPT) + QUESTIONS[0], first, QUESTIONS[1])
        second, _ = reply(engine, prompt, sampling)
        again, events = reply(engine, prompt, sampling)
        assert again == second
        assert events[0].prefill_tokens == 1


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("name", ENGINES)
def test_a_cut_reply_leaves_caches_the_next_turn_reuses_exactly(tiny_target, tiny_draft, name, sampling):
    """Cut after one event; the history keeps fewer tokens than were generated (the app may not
    have shown the last ones), and the next turn decodes as a fresh engine would."""
    with engine_named(name, tiny_target, tiny_draft) as engine:
        prompt = list(PROMPT) + QUESTIONS[0]
        cut, _ = reply(engine, prompt, sampling, events_kept=2)
        kept = cut[: max(1, len(cut) - 1)]
        follow_up = next_prompt(prompt, kept, QUESTIONS[1])
        tokens, events = reply(engine, follow_up, sampling)
        assert tokens == fresh_reply(name, tiny_target, tiny_draft, follow_up, sampling)
        assert events[0].prefill_tokens <= len(follow_up) - len(prompt)


@pytest.mark.parametrize("name", ["autoregressive", "specexec", "dsi"])
def test_forget_drops_the_caches_and_the_next_prompt_is_prefilled_in_full(tiny_target, tiny_draft, name):
    with engine_named(name, tiny_target, tiny_draft) as engine:
        prompt = list(PROMPT) + QUESTIONS[0]
        tokens, _ = reply(engine, prompt, GREEDY)
        engine.forget()
        again, events = reply(engine, prompt, GREEDY)
        assert again == tokens and events[0].prefill_tokens == len(prompt)


@pytest.mark.parametrize("name", ["autoregressive", "specexec", "sd"])
def test_the_target_cache_holds_the_sequence_but_its_last_token_after_a_reply(tiny_target, tiny_draft, name):
    with engine_named(name, tiny_target, tiny_draft) as engine:
        prompt = list(PROMPT) + QUESTIONS[0]
        tokens, _ = reply(engine, prompt, SEEDED)
        history = engine.history
        assert history.tokens == prompt + tokens
        assert cache_length(history.caches[0]) == len(history.tokens) - 1
        for cache in history.caches[1:]:  # a draft cache may lag, never lead
            assert cache_length(cache) <= len(history.tokens) - 1


def test_an_error_mid_reply_drops_the_caches(tiny_target):
    """A failure between the cache's update and the sequence's leaves them out of step: the
    engine forgets them rather than reuse them."""
    engine = AutoregressiveEngine(tiny_target, [])
    reply(engine, list(PROMPT), GREEDY)
    held = engine.history.caches[0]

    def explode(*_args):
        raise RuntimeError("boom")

    handle = engine.target.model.get_decoder().layers[1].register_forward_pre_hook(explode)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            reply(engine, list(PROMPT) + [5, 6], GREEDY)
    finally:
        handle.remove()
    assert engine.history.tokens == [] and engine.history.caches[0] is not held


def test_reuse_off_prefills_every_prompt_in_full(tiny_target):
    engine = AutoregressiveEngine(tiny_target, [])
    engine.history = PrefixCache(1, reuse=False)
    prompt = list(PROMPT) + QUESTIONS[0]
    tokens, _ = reply(engine, prompt, GREEDY)
    _, events = reply(engine, prompt + tokens + END, GREEDY)
    assert events[0].prefill_tokens == len(prompt + tokens + END)


@pytest.mark.parametrize("a,b,expected", [([], [1], 0), ([1, 2, 3], [1, 2, 4], 2), ([1, 2], (1, 2, 3), 2), ([5], [6], 0)])
def test_common_prefix(a, b, expected):
    assert common_prefix(a, b) == expected


def test_begin_cuts_every_cache_to_the_shared_prefix_and_leaves_a_token_to_run(tiny_target):
    history = PrefixCache(2)
    tokens = list(PROMPT) + [20, 21, 22]
    for cache, length in zip(history.caches, (len(tokens), 4)):
        tiny_target.hidden(torch.tensor(tokens[:length]), torch.arange(length), cache)
    history.tokens = list(tokens)
    reuse = history.begin(tokens[:7] + [40, 41])
    assert reuse.reused == 7 and reuse.prefill_tokens == 2
    assert [cache_length(c) for c in history.caches] == [7, 4]
    assert history.begin(tokens[:5]).reused == 4  # the same prompt again: its last token runs
    assert history.begin(tokens[:5], limit=2).reused == 2
