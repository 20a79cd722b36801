"""A prompt's own logprobs: an entry for each token after the first, the target's log-probability
of it after the ones before it and its likeliest alternatives there, as transformers' forward
gives them, the LM head run in blocks of rows to the same numbers; an engine scores on a cache of
its own, so its next reply reuses its kept caches. DSI refuses in one line."""

import pytest
import torch
from helpers.dsi_turns import dsi
from helpers.engines import GREEDY, PROMPT, run

from specchat.decoding import prompt_logprobs as module
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.prompt_logprobs import prompt_logprobs
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError

LONG = [(7 * i + 3) % 50 for i in range(150)]  # past two blocks of HEAD_ROWS


def test_each_token_after_the_first_gets_the_targets_logprob_and_alternatives(tiny_target):
    entries = prompt_logprobs(tiny_target, LONG, 3)
    with torch.inference_mode():  # float32 logits, as the LM head gives every pass's
        expected = torch.log_softmax(tiny_target.model(torch.tensor([LONG])).logits[0].float().double(), dim=-1)
    assert [entry.token for entry in entries] == LONG[1:]
    assert [entry.logprob for entry in entries] == [expected[i, LONG[i + 1]].item() for i in range(len(LONG) - 1)]
    tops = [torch.topk(row, 3) for row in expected[:-1]]
    assert [entry.top for entry in entries] == [tuple(zip(top.indices.tolist(), top.values.tolist())) for top in tops]


def test_blocks_of_rows_give_what_one_block_gives(tiny_target, monkeypatch):
    blocked = prompt_logprobs(tiny_target, LONG, 2)
    monkeypatch.setattr(module, "HEAD_ROWS", len(LONG))
    assert prompt_logprobs(tiny_target, LONG, 2) == blocked
    assert prompt_logprobs(tiny_target, LONG[:1], 2) == []  # one token: nothing before it to score it after


@pytest.mark.parametrize("make", [lambda target, draft: AutoregressiveEngine(target, []),
                                  lambda target, draft: TreeEngine(SPECEXEC, target, draft, [], TreeShape(8, 4))],
                         ids=["autoregressive", "specexec"])
def test_an_engine_scores_with_its_target_and_keeps_its_caches(tiny_target, tiny_draft, make):
    engine = make(tiny_target, tiny_draft)
    first, _ = run(engine, GREEDY, max_new_tokens=6)
    assert engine.score(LONG[:20], 1) == prompt_logprobs(tiny_target, LONG[:20], 1)
    _, events = run(engine, GREEDY, max_new_tokens=6, prompt=PROMPT + first + [5, 9])
    assert events[0].prefill_tokens == 3  # the reply's last token, then the two new ones


def test_dsi_refuses_to_score_in_one_line(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=2) as engine:
        with pytest.raises(SpecchatError, match="--engine dsi scores no prompts"):
            engine.score(LONG[:5], 1)
