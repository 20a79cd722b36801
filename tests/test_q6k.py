"""A Q6_K tensor kept in 8.6 bits a weight (quant/q6k.py) and multiplied a chunk of rows at a time
(quant/q6k_linear.py): its weights are gguf's own dequantization bitwise, in any dtype the dense
conversion's rounded once; a plan short of memory keeps the LM head so, and only then."""

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, quants
from safetensors.torch import save_file
from test_int4_gguf import random_blocks
from transformers import Qwen2Config, Qwen2ForCausalLM

from specchat.errors import SpecchatError
from specchat.models.loading import load
from specchat.offload.budget import Ask, Target, plan_memory
from specchat.offload.demand import ModelShape
from specchat.offload.placement import ModelSizes, Request, Rooms
from specchat.quant import q6k_linear
from specchat.quant.int4_checkpoint import INT4_FILE
from specchat.quant.q6k import q6_bytes, q6_entries, q6k_to_weight
from specchat.quant.q6k_linear import Q6Linear

Q6_K = GGMLQuantizationType.Q6_K


def q6_linear(out_features: int, in_features: int, seed: int = 0) -> tuple[Q6Linear, torch.Tensor]:
    """A Q6Linear over random Q6_K blocks, and gguf's float32 dequantization of them."""
    data = random_blocks(Q6_K, out_features, in_features, seed=seed)
    weight = q6k_to_weight(data)
    linear = Q6Linear(in_features, out_features)
    linear.q6_values, linear.q6_scales, linear.q6_d = weight.values, weight.scales, weight.d
    return linear, torch.from_numpy(quants.dequantize(data, Q6_K))


def test_q6k_blocks_convert_to_gguf_own_weights_bitwise():
    data = random_blocks(Q6_K, 48, 768, seed=2)
    weight = q6k_to_weight(data)
    reference = torch.from_numpy(quants.dequantize(data, Q6_K))
    assert weight.values.dtype == torch.int8 and int(weight.values.min()) >= -32 and int(weight.values.max()) <= 31
    assert torch.equal(weight.dequantize(), reference)
    assert torch.equal(weight.dequantize(slice(5, 17)), reference[5:17])
    stored = sum(t.numel() * t.element_size() for t in q6_entries("head", weight).values())
    assert stored == q6_bytes(48, 768) == 48 * 768 * (1 + 1 / 16 + 4 / 256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunked_product_multiplies_by_the_dense_weight_rounded_once(monkeypatch, dtype):
    monkeypatch.setattr(q6k_linear, "CHUNK_ROWS", 24)  # 4 chunks of 80 rows, the last one short
    linear, dense = q6_linear(80, 512)
    # an identity input reads each weight back alone: no sum can round it
    assert torch.equal(linear(torch.eye(512, dtype=dtype)), dense.to(dtype).t())
    x = torch.randn(2, 3, 512, dtype=dtype)
    # sums over chunks of rows are the whole product's sums: only their order may differ
    torch.testing.assert_close(linear(x), x @ dense.to(dtype).t(), rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 0.05)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny untied Qwen2 whose LM head holds random Q6_K blocks: their Q6Weight in int4.safetensors
    and their float32 dequantization in the dense model.safetensors, as models/convert_int4.py writes."""
    directory = tmp_path_factory.mktemp("q6")
    config = Qwen2Config(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    data = random_blocks(Q6_K, 96, 256, seed=3)
    model.lm_head.weight.data = torch.from_numpy(quants.dequantize(data, Q6_K))
    model.save_pretrained(directory)
    save_file(q6_entries("lm_head", q6k_to_weight(data)), str(directory / INT4_FILE))
    return directory


def test_a_compact_head_loads_as_a_q6_linear_holding_the_dense_weights(checkpoint):
    dense = load(str(checkpoint), torch.bfloat16, progress=False).model.get_output_embeddings()
    compact = load(str(checkpoint), torch.bfloat16, progress=False, compact_head=True).model.get_output_embeddings()
    assert isinstance(dense, torch.nn.Linear) and isinstance(compact, Q6Linear)
    assert torch.equal(compact(torch.eye(256, dtype=torch.bfloat16)), dense.weight.t())


def test_a_compact_head_the_checkpoint_lacks_is_one_line(tmp_path):
    Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
                     ).save_pretrained(tmp_path)
    down = q6k_to_weight(random_blocks(Q6_K, 256, 512))  # a Q6Weight, but for another module
    save_file(q6_entries("model.layers.0.mlp.down_proj", down), str(tmp_path / INT4_FILE))
    with pytest.raises(SpecchatError, match="no Q6_K LM head"):
        load(str(tmp_path), torch.bfloat16, progress=False, compact_head=True)


UNIT = 100 * 4096  # a decoder layer, a whole number of O_DIRECT pages (one ring slot)


def plan(device_units: float):
    sizes = ModelSizes(layers=(UNIT,) * 4, fixed=10 * UNIT, headroom=0, file_bytes=4 * UNIT)
    target = Target(sizes, ModelShape(2, 8, 16, 1, 2), compact_fixed=6 * UNIT)
    ask = Ask(contexts=(8,), drafts=(None,), tree_tokens=2, workspace=0, request=Request("disk", 0))
    return plan_memory(target, ask, Rooms(int(device_units * UNIT), None, 10**9))


def test_the_plan_keeps_the_head_compact_only_where_the_dense_one_does_not_fit():
    roomy = plan(20)
    assert not roomy.compact_head and roomy.items[0].nbytes == 10 * UNIT
    tight = plan(10)  # the smallest ring (two slots) fits beside the compact fixed parts, not the dense ones
    assert tight.compact_head and tight.items[0].nbytes == 6 * UNIT
    assert any("Q6_K" in note for note in tight.notes)
    with pytest.raises(SpecchatError, match="short"):
        plan(7)  # not even beside the compact head
