"""Logit bias and repetition penalties: each formula against transformers' processor or OpenAI's
written one, the windows, and the engines: SpecExec emits what autoregressive decoding emits under
them, greedy and seeded, and autoregressive greedy is HF generate's under repetition_penalty."""

from collections import Counter

import pytest
import torch
from helpers.engines import GREEDY, PROMPT, run
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import SamplingParams
from specchat.decoding.penalties import Penalties, Tally, Window, counted_from, llama_penalties
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError

VOCAB = 50


def logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def fed(penalties: Penalties, prompt: list[int], reply: list[int]):
    state = penalties.start(prompt)
    for token in reply:
        state.accept(token)
    return state


def test_repetition_is_transformers_repetition_penalty_over_prompt_and_reply():
    prompt, reply = [3, 7, 7, 9], [1, 3, 12]
    state = fed(Penalties(repeat=1.7), prompt, reply)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + reply]), logits()[None].clone())[0]
    assert torch.equal(state.penalized(logits()), expected)  # bit for bit, negative and positive logits alike


def test_presence_and_frequency_are_openais_formula_over_the_reply_only():
    prompt, reply = [5, 5, 6], [6, 8, 8, 8]
    state = fed(Penalties(presence=0.5, frequency=0.25), prompt, reply)
    expected = logits().clone()
    for token, count in {6: 1, 8: 3}.items():  # the prompt's 5 and 6 do not count
        expected[token] -= count * 0.25 + 0.5
    assert torch.equal(state.penalized(logits()), expected)


def test_llama_cpps_window_counts_the_last_n_of_prompt_and_reply_for_all_three():
    window = Window(last=3)
    state = fed(Penalties(repeat=2.0, repeat_window=window, frequency=1.0, count_window=window), [4, 4, 9], [11, 4])
    raw, scores = logits(), state.penalized(logits())
    # the window is [9, 11, 4]: the prompt's first two 4s have left it
    changed = {token for token in range(VOCAB) if scores[token] != raw[token]}
    assert changed == {4, 9, 11}
    repeated = raw[4] / 2 if raw[4] > 0 else raw[4] * 2
    assert scores[4] == repeated - 1.0


def test_a_window_of_none_counts_nothing_and_the_bias_still_applies():
    state = fed(Penalties(bias=((2, -100.0), (3, 5.0)), repeat=3.0, repeat_window=Window(last=0)), [1, 2], [3])
    expected = logits().clone()
    expected[2] -= 100
    expected[3] += 5
    assert torch.equal(state.penalized(logits()), expected)


@pytest.mark.parametrize("window", [Window(last=3), Window(last=1), Window(last=0), Window(),
                                    Window(last=4, prompt=False)])
def test_a_tally_counts_exactly_the_tokens_its_window_holds_at_every_step(window):
    """Repeats come and leave the window: a count falls to 0 and the token leaves the tally, and a
    token that left once with a repeat still inside keeps that repeat's count."""
    prompt, reply = [4, 4, 9, 4], [11, 4, 4, 12, 9, 9, 9, 13, 4]
    tally = Tally(window, prompt)
    seen = list(prompt) if window.prompt else []
    for token in [None, *reply]:
        if token is not None:
            tally.add(token)
            seen.append(token)
        held = seen if window.last < 0 else seen[max(0, len(seen) - window.last):] if window.last else []
        assert sorted(tally.counts.items()) == sorted(Counter(held).items())  # no token left at a count of 0


def test_penalties_that_change_nothing_leave_the_sampling_as_it_was(tiny_target, tiny_draft):
    """A request that names its penalties at their neutral values (Ollama sends repeat_penalty 1.0)
    gets the path without them: an engine that keeps no forms runs it instead of refusing."""
    neutral = llama_penalties(1.0, 64, 0.0, 0.0)
    assert counted_from(GREEDY, neutral, PROMPT) is GREEDY
    engine = TreeEngine(CHAIN_SD, tiny_target, tiny_draft, [], TreeShape(budget=4, max_depth=4))
    assert run(engine, counted_from(GREEDY, neutral, PROMPT))[0] == run(AutoregressiveEngine(tiny_target, []),
                                                                         GREEDY)[0]


def test_llama_clis_penalties_all_count_its_window_of_prompt_and_reply():
    window = Window(last=8)
    assert llama_penalties(1.2, 8, 0.5, 0.1) == Penalties(repeat=1.2, repeat_window=window, presence=0.5,
                                                         frequency=0.1, count_window=window)
    assert not llama_penalties(1.0, 64).active


def test_without_any_penalty_nothing_is_active():
    assert not Penalties().active
    assert Penalties(repeat=1.1).active and Penalties(bias=((1, 0.5),)).active and Penalties(presence=-1).active


PENALTIES = Penalties(bias=((7, 2.0),), repeat=1.5, presence=0.4, frequency=0.3)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_specexec_under_bias_and_penalties_emits_autoregressive_decodings_tokens(tiny_target, tiny_draft,
                                                                                temperature):
    def tokens(engine, penalties):
        sampling = SamplingParams(temperature, 1.0, seed=9, penalties=penalties and penalties.start(PROMPT))
        return run(engine, sampling)[0]

    reference = tokens(AutoregressiveEngine(tiny_target, []), PENALTIES)
    tree = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8))
    assert tokens(tree, PENALTIES) == reference
    assert reference != tokens(AutoregressiveEngine(tiny_target, []), None)  # the penalties changed the reply


def test_autoregressive_greedy_under_repetition_penalty_is_hf_generates(tiny_target):
    sampling = SamplingParams(0.0, 1.0, penalties=Penalties(repeat=1.3).start(PROMPT))
    tokens, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    reference = tiny_target.model.generate(torch.tensor([PROMPT]), max_new_tokens=40, min_new_tokens=40,
                                           do_sample=False, repetition_penalty=1.3)[0, len(PROMPT):].tolist()
    assert tokens == reference
    assert tokens != run(AutoregressiveEngine(tiny_target, []), GREEDY)[0]


def test_an_engine_that_keeps_no_forms_refuses_penalties(tiny_target, tiny_draft):
    engine = TreeEngine(CHAIN_SD, tiny_target, tiny_draft, [], TreeShape(budget=4, max_depth=4))
    with pytest.raises(SpecchatError, match="penalize repeats"):
        run(engine, SamplingParams(0.0, 1.0, penalties=Penalties(repeat=1.2).start(PROMPT)))
