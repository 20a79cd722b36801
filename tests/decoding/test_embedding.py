"""An embedding is the target's final-norm rows (transformers' own forward's last hidden state)
pooled by their mean or their last row, on a cache of its own: the engine's kept caches and its
next reply are as they would be without it. DSI refuses it in one line."""

import pytest
import torch
from helpers.dsi_turns import dsi
from helpers.engines import GREEDY, PROMPT, run

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.embedding import embedding, pooled
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError

TEXT = [7, 3, 19, 3, 41, 0, 12]


def transformers_rows(target, ids: list[int]) -> torch.Tensor:
    """The last hidden state of transformers' forward of the whole model, no cache: the rows its
    LM head reads."""
    with torch.inference_mode():
        return target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def test_pooled_takes_the_mean_or_the_last_row_in_float32():
    rows = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]], dtype=torch.float64)
    assert pooled(rows, "mean").tolist() == [3.0, 3.0] and pooled(rows, "mean").dtype == torch.float32
    assert pooled(rows, "last").tolist() == [5.0, 1.0]
    with pytest.raises(ValueError, match="pooling must be one of mean, last"):
        pooled(rows, "max")


@pytest.mark.parametrize("pooling,pool", [("mean", lambda rows: rows.mean(0)), ("last", lambda rows: rows[-1])])
def test_an_embedding_pools_the_rows_of_transformers_forward(tiny_target, pooling, pool):
    rows = transformers_rows(tiny_target, TEXT)
    assert torch.equal(embedding(tiny_target, TEXT, pooling), pool(rows.float()))


def test_the_mean_differs_from_the_last_row_and_each_text_has_its_own(tiny_target):
    """What the two tests above could not tell apart: the pools of one text, and two texts."""
    assert not torch.equal(embedding(tiny_target, TEXT, "mean"), embedding(tiny_target, TEXT, "last"))
    assert not torch.equal(embedding(tiny_target, TEXT, "mean"), embedding(tiny_target, TEXT[:-1], "mean"))


@pytest.mark.parametrize("make", [lambda target, draft: AutoregressiveEngine(target, []),
                                  lambda target, draft: TreeEngine(SPECEXEC, target, draft, [], TreeShape(8, 4))],
                         ids=["autoregressive", "specexec"])
def test_an_engine_embeds_with_its_target_and_keeps_its_caches(tiny_target, tiny_draft, make):
    """A reply, an embedding, then the conversation's next reply: it reuses the first reply's caches
    (it prefills only the new tokens) and gives what a fresh engine gives."""
    engine = make(tiny_target, tiny_draft)
    first, _ = run(engine, GREEDY, max_new_tokens=6)
    assert torch.equal(engine.embed(TEXT, "last"), embedding(tiny_target, TEXT, "last"))
    follow_up = PROMPT + first + [5, 9]
    tokens, events = run(engine, GREEDY, max_new_tokens=6, prompt=follow_up)
    assert events[0].prefill_tokens == 3  # the reply's last token, then the two new ones
    assert tokens == run(make(tiny_target, tiny_draft), GREEDY, max_new_tokens=6, prompt=follow_up)[0]


def test_dsi_refuses_an_embedding_in_one_line(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=2) as engine:
        with pytest.raises(SpecchatError, match="--engine dsi computes no embeddings"):
            engine.embed(TEXT, "mean")
