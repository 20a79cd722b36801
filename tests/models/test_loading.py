"""models/loading.py's front door for an embedded model run from its 4-bit weights (`weights`
quantized): its 4-bit conversion loaded with each linear in its stored form, its tokenizer the
dense conversion's, its logits the dense model's; a model with no 4-bit weights to run refused in
one line."""

import pytest
import torch
from helpers.gguf_files import embed_as_draft, fake_draft, tiny_gguf  # noqa: F401 (fixtures)
from helpers.gguf_q4km_writer import write_q4km_gguf
from helpers.moe import logits

from specchat.decoding.forward import CausalLM
from specchat.errors import SpecchatError
from specchat.models.embedded import converted_path, int4_path
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_embedding import Int4Embedding


@pytest.fixture
def fake_q4km_draft(tmp_path, monkeypatch):
    return embed_as_draft(write_q4km_gguf(tmp_path / "tiny.gguf"), tmp_path, monkeypatch)


def test_quantized_weights_load_the_4bit_conversion_with_the_dense_tokenizer_and_logits(fake_q4km_draft):
    quantized = load(DEFAULT_DRAFT, torch.float32, progress=False, weights="quantized")
    dense = load(DEFAULT_DRAFT, torch.float32, progress=False)
    assert quantized.directory == int4_path(fake_q4km_draft) and dense.directory == converted_path(fake_q4km_draft)
    assert type(quantized.model.model.layers[1].mlp.gate_proj) is Int4Linear
    assert type(quantized.model.model.embed_tokens) is Int4Embedding
    assert not quantized.model.training and not any(p.requires_grad for p in quantized.model.parameters())
    text = "the tiny model"
    assert quantized.tokenizer(text)["input_ids"] == dense.tokenizer(text)["input_ids"]
    assert quantized.tokenizer.chat_template == dense.tokenizer.chat_template
    # float32 rounding only: at most 1.9e-6 on logits up to 3.8 (test_convert_int4.py's measurement)
    torch.testing.assert_close(logits(CausalLM(quantized.model)), logits(CausalLM(dense.model)), atol=1e-5, rtol=0)


def test_quantized_weights_of_a_model_that_stores_none_are_refused_in_one_line(tiny_gguf):  # noqa: F811
    words = (r"^--weights quantized runs a model from the 4-bit weights it stores, and tiny stores none that "
             r"specchat multiplies packed: use --weights dense$")
    with pytest.raises(SpecchatError, match=words):
        load(str(tiny_gguf), torch.float32, progress=False, weights="quantized")
