"""A prompt's own logprobs: an entry for each token after the first, the target's log-probability
of it after the ones before it and its likeliest alternatives there, as transformers' forward
gives them, the LM head run in blocks of rows to the same numbers; an engine scores on its kept
target cache, so that the reply to the prompt it scored computes only the last token again, and
gives the tokens a fresh engine gives. DSI refuses in one line."""

import pytest
import torch
from helpers.dsi_turns import dsi
from helpers.engines import GREEDY, run

from specchat.decoding import prompt_logprobs as module
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.kvcache import new_cache
from specchat.decoding.prompt_logprobs import prompt_logprobs
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError

LONG = [(7 * i + 3) % 50 for i in range(150)]  # past two blocks of HEAD_ROWS


def test_each_token_after_the_first_gets_the_targets_logprob_and_alternatives(tiny_target):
    entries = prompt_logprobs(tiny_target, LONG, 3, new_cache())
    with torch.inference_mode():  # float32 logits, as the LM head gives every pass's
        expected = torch.log_softmax(tiny_target.model(torch.tensor([LONG])).logits[0].float().double(), dim=-1)
    assert [entry.token for entry in entries] == LONG[1:]
    assert [entry.logprob for entry in entries] == [expected[i, LONG[i + 1]].item() for i in range(len(LONG) - 1)]
    tops = [torch.topk(row, 3) for row in expected[:-1]]
    assert [entry.top for entry in entries] == [tuple(zip(top.indices.tolist(), top.values.tolist())) for top in tops]


def test_blocks_of_rows_give_what_one_block_gives(tiny_target, monkeypatch):
    blocked = prompt_logprobs(tiny_target, LONG, 2, new_cache())
    monkeypatch.setattr(module, "HEAD_ROWS", len(LONG))
    assert prompt_logprobs(tiny_target, LONG, 2, new_cache()) == blocked
    assert prompt_logprobs(tiny_target, LONG[:1], 2, new_cache()) == []  # one token: nothing before it to score


ENGINES = [lambda target, draft: AutoregressiveEngine(target, []),
           lambda target, draft: TreeEngine(SPECEXEC, target, draft, [], TreeShape(8, 4))]


@pytest.mark.parametrize("make", ENGINES, ids=["autoregressive", "specexec"])
def test_an_engine_scores_with_its_target_and_its_reply_to_that_prompt_runs_one_token(tiny_target, tiny_draft, make):
    engine = make(tiny_target, tiny_draft)
    run(engine, GREEDY, max_new_tokens=6)  # an earlier conversation, replaced by the scored prompt
    prompt = LONG[:20]
    assert engine.score(prompt, 1) == prompt_logprobs(tiny_target, prompt, 1, new_cache())
    tokens, events = run(engine, GREEDY, max_new_tokens=6, prompt=prompt)
    assert events[0].prefill_tokens == 1  # the prompt's last token: its row gives the first new token
    assert tokens == run(make(tiny_target, tiny_draft), GREEDY, max_new_tokens=6, prompt=prompt)[0]


@pytest.mark.parametrize("make", ENGINES, ids=["autoregressive", "specexec"])
def test_a_prompt_that_extends_the_kept_conversation_is_scored_from_its_first_token(tiny_target, tiny_draft, make):
    """The pass runs every token from position 0 on a cache cut to nothing, whatever it shares
    with the conversation before (a kept prefix would shift the rows it gives)."""
    engine = make(tiny_target, tiny_draft)
    run(engine, GREEDY, max_new_tokens=6, prompt=LONG[:10])
    assert engine.score(LONG[:20], 2) == prompt_logprobs(tiny_target, LONG[:20], 2, new_cache())


@pytest.mark.parametrize("make", ENGINES, ids=["autoregressive", "specexec"])
def test_a_scoring_pass_that_fails_drops_the_kept_caches(tiny_target, tiny_draft, make, monkeypatch):
    engine = make(tiny_target, tiny_draft)
    run(engine, GREEDY, max_new_tokens=6)
    monkeypatch.setattr(module, "TokenLog", None)  # fails after the pass has filled the cache
    with pytest.raises(TypeError):
        engine.score(LONG[:20], 1)
    monkeypatch.undo()
    _, events = run(engine, GREEDY, max_new_tokens=6, prompt=LONG[:20])
    assert events[0].prefill_tokens == 20


def test_dsi_refuses_to_score_in_one_line(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=2) as engine:
        with pytest.raises(SpecchatError, match="--engine dsi scores no prompts"):
            engine.score(LONG[:5], 1)
