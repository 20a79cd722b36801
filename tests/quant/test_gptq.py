"""GPTQ 4-bit format: unpacking against the format's definition, packing round trips, the
GPTQLinear module, round-to-nearest quantization, the checkpoint writer, and config reading."""

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.gptq_writer import pack_gptq, quantize_rtn, write_gptq_checkpoint
from helpers.tiny import tiny_qwen_config
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from safetensors.torch import load_file
from transformers import GPTQConfig, Qwen2ForCausalLM

from specchat.errors import SpecchatError
from specchat.quant.gptq import (
    GPTQLinear,
    GPTQSpec,
    dequantize,
    pack_int4_cols,
    pack_int4_rows,
    read_gptq_spec,
    replace_linears_with_gptq,
    unpack_int4_cols,
    unpack_int4_rows,
)


# --- the format's definition, written out independently of the code under test ---------------

def int32(word: int) -> int:
    """An unsigned 32-bit word as the signed int32 a checkpoint stores."""
    return word - 2**32 if word >= 2**31 else word


def pack_weight_by_hand(q: list[list[int]]) -> torch.Tensor:
    """q[i][o] -> qweight: input row i is nibble i % 8 of word [i // 8, o]."""
    words = [[0] * len(q[0]) for _ in range(len(q) // 8)]
    for i, row in enumerate(q):
        for o, value in enumerate(row):
            words[i // 8][o] |= value << (4 * (i % 8))
    return torch.tensor([[int32(w) for w in row] for row in words], dtype=torch.int32)


def pack_zeros_by_hand(zeros: list[list[int]]) -> torch.Tensor:
    """zeros[j][o] -> qzeros: column o is nibble o % 8 of word [j, o // 8], stored minus one."""
    words = [[0] * (len(zeros[0]) // 8) for _ in zeros]
    for j, row in enumerate(zeros):
        for o, zero in enumerate(row):
            words[j][o // 8] |= (zero - 1) << (4 * (o % 8))
    return torch.tensor([[int32(w) for w in row] for row in words], dtype=torch.int32)


def weight_by_definition(q, zeros, scales, g_idx) -> torch.Tensor:
    """W[o, i] = scales[g_idx[i], o] * (q[i, o] - zero[g_idx[i], o])."""
    rows, cols = len(q), len(q[0])
    return torch.tensor([
        [float(scales[g_idx[i]][o]) * (q[i][o] - zeros[g_idx[i]][o]) for i in range(rows)]
        for o in range(cols)
    ])


ROWS, COLS = 16, 8
Q = [[(3 * i + 5 * o + 7) % 16 for o in range(COLS)] for i in range(ROWS)]
ACT_ORDER = [1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1]


def hand_case(groups: list[int], sym: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    count = max(groups) + 1
    zeros = [[8 if sym else 1 + (5 * j + 3 * o) % 15 for o in range(COLS)] for j in range(count)]
    scales = [[(j + 1) * 0.125 + o * 0.0625 for o in range(COLS)] for j in range(count)]
    packed = {
        "qweight": pack_weight_by_hand(Q),
        "qzeros": pack_zeros_by_hand(zeros),
        "scales": torch.tensor(scales, dtype=torch.float16),
        "g_idx": torch.tensor(groups, dtype=torch.int32),
    }
    return packed, weight_by_definition(Q, zeros, scales, groups)


@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize(
    "groups",
    [[i // 8 for i in range(ROWS)], [0] * ROWS, ACT_ORDER],
    ids=["group_size_8", "group_size_-1", "act_order"],
)
def test_dequantize_matches_the_format_definition(groups: list[int], sym: bool) -> None:
    packed, expected = hand_case(groups, sym)
    assert (packed["qweight"] < 0).any()  # some words have a top nibble >= 8
    weight = dequantize(packed["qweight"], packed["qzeros"], packed["scales"], packed["g_idx"], torch.float32)
    assert weight.shape == (COLS, ROWS)
    assert torch.equal(weight, expected)


def test_sym_checkpoint_stores_seven_for_zero_eight() -> None:
    qweight = torch.full((1, 8), int32(0xFEDCBA98), dtype=torch.int32)  # rows 0..7 hold 8..15
    qzeros = torch.full((1, 1), 0x77777777, dtype=torch.int32)
    scales = torch.full((1, 8), 0.5, dtype=torch.float16)
    weight = dequantize(qweight, qzeros, scales, torch.zeros(8, dtype=torch.int32), torch.float32)
    assert torch.equal(weight, 0.5 * torch.arange(8.0).expand(8, 8))


def test_unpack_reads_nibbles_low_to_high_even_in_negative_words() -> None:
    word = torch.tensor([[int32(0x87654321)]], dtype=torch.int32)
    assert word.item() < 0
    assert unpack_int4_rows(word).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert unpack_int4_cols(word).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert unpack_int4_rows(torch.tensor([[-1]], dtype=torch.int32)).flatten().tolist() == [15] * 8


# --- packing round trips -----------------------------------------------------------------------

shapes = st.tuples(st.integers(1, 4), st.integers(1, 5))


@settings(max_examples=60, deadline=None)
@given(shapes.flatmap(lambda s: arrays(np.uint8, (8 * s[0], s[1]), elements=st.integers(0, 15))))
def test_pack_rows_round_trip(values: np.ndarray) -> None:
    packed = pack_int4_rows(torch.from_numpy(values))
    assert packed.dtype == torch.int32 and packed.shape == (values.shape[0] // 8, values.shape[1])
    assert torch.equal(unpack_int4_rows(packed), torch.from_numpy(values))


@settings(max_examples=60, deadline=None)
@given(shapes.flatmap(lambda s: arrays(np.uint8, (s[0], 8 * s[1]), elements=st.integers(0, 15))))
def test_pack_cols_round_trip(values: np.ndarray) -> None:
    packed = pack_int4_cols(torch.from_numpy(values))
    assert packed.dtype == torch.int32 and packed.shape == (values.shape[0], values.shape[1] // 8)
    assert torch.equal(unpack_int4_cols(packed), torch.from_numpy(values))


@settings(max_examples=60, deadline=None)
@given(shapes.flatmap(lambda s: arrays(np.int32, s)))
def test_every_int32_word_survives_unpack_and_pack(words: np.ndarray) -> None:
    packed = torch.from_numpy(words)
    assert torch.equal(pack_int4_rows(unpack_int4_rows(packed)), packed)
    assert torch.equal(pack_int4_cols(unpack_int4_cols(packed)), packed)


def test_pack_sets_the_sign_bit_for_a_high_top_nibble() -> None:
    values = torch.tensor([[0], [0], [0], [0], [0], [0], [0], [8]])
    assert pack_int4_rows(values).item() == -(2**31)


# --- GPTQLinear ----------------------------------------------------------------------------------

IN, OUT, GROUPS = 32, 16, 4


def random_packed(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "qweight": torch.randint(-(2**31), 2**31, (IN // 8, OUT), dtype=torch.int32, generator=generator),
        "qzeros": torch.randint(-(2**31), 2**31, (GROUPS, OUT // 8), dtype=torch.int32, generator=generator),
        "scales": (torch.rand(GROUPS, OUT, generator=generator) * 0.02 + 0.005).half(),
        "g_idx": torch.randperm(IN, generator=generator).remainder(GROUPS).to(torch.int32),
        "bias": torch.randn(OUT, generator=generator).half(),
    }


def reference_weight(packed: dict[str, torch.Tensor]) -> torch.Tensor:
    q = [[(int(packed["qweight"][i // 8, o]) >> (4 * (i % 8))) & 0xF for o in range(OUT)] for i in range(IN)]
    zeros = [[((int(packed["qzeros"][j, o // 8]) >> (4 * (o % 8))) & 0xF) + 1 for o in range(OUT)]
             for j in range(GROUPS)]
    return weight_by_definition(q, zeros, packed["scales"].tolist(), packed["g_idx"].tolist())


@pytest.fixture(scope="module")
def packed() -> dict[str, torch.Tensor]:
    return random_packed(0)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(3, 5, IN, generator=torch.Generator().manual_seed(1))


def expected_output(packed: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return F.linear(x.float(), reference_weight(packed), packed["bias"].float())


def test_forward_float32(packed, x) -> None:
    layer = GPTQLinear(IN, OUT, GROUPS, bias=True)
    layer.load_state_dict(packed)
    torch.testing.assert_close(layer(x), expected_output(packed, x), rtol=1e-6, atol=1e-6)


def test_forward_bfloat16(packed, x) -> None:
    layer = GPTQLinear(IN, OUT, GROUPS, bias=True)
    layer.load_state_dict(packed)
    out = layer(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected_output(packed, x.bfloat16()), rtol=2e-2, atol=2e-2)


def test_buffers_are_what_a_per_layer_storage_packs() -> None:
    layer = GPTQLinear(IN, OUT, GROUPS, bias=True, device="meta")
    names = {"qweight", "qzeros", "scales", "g_idx", "bias"}
    assert set(dict(layer.named_buffers())) == names == set(layer.state_dict())
    assert list(layer.parameters()) == []
    assert all(t.is_meta for t in layer.state_dict().values())
    assert "bias" not in GPTQLinear(IN, OUT, GROUPS, bias=False).state_dict()


def test_built_on_meta_then_assigned(packed, x) -> None:
    layer = GPTQLinear(IN, OUT, GROUPS, bias=True, device="meta")
    for name, tensor in packed.items():
        setattr(layer, name, tensor)
    torch.testing.assert_close(layer(x), expected_output(packed, x), rtol=1e-6, atol=1e-6)


def test_functional_call_binds_the_buffers(packed, x) -> None:
    layer = GPTQLinear(IN, OUT, GROUPS, bias=True, device="meta")
    out = torch.func.functional_call(layer, packed, (x,))
    torch.testing.assert_close(out, expected_output(packed, x), rtol=1e-6, atol=1e-6)


def test_forward_without_bias(packed, x) -> None:
    layer = GPTQLinear(IN, OUT, GROUPS, bias=False)
    layer.load_state_dict({k: v for k, v in packed.items() if k != "bias"})
    torch.testing.assert_close(layer(x), F.linear(x, reference_weight(packed)), rtol=1e-6, atol=1e-6)


# --- round-to-nearest quantization ---------------------------------------------------------------

def dequantize_packed(tensors: dict[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
    return dequantize(*(tensors[prefix + k] for k in ("qweight", "qzeros", "scales", "g_idx")), torch.float32)


def assert_within_half_a_step(weight: torch.Tensor, tensors: dict[str, torch.Tensor], prefix: str = "") -> None:
    step = tensors[prefix + "scales"].float()[tensors[prefix + "g_idx"].long()].t()
    error = (dequantize_packed(tensors, prefix) - weight.float()).abs()
    assert (error <= step / 2 + 1e-6).all(), (error / step).max()


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size", [8, 32, -1])
@pytest.mark.parametrize("sym", [False, True])
def test_rtn_error_is_at_most_half_a_step(sym: bool, group_size: int, act_order: bool) -> None:
    weight = torch.randn(24, 64, generator=torch.Generator().manual_seed(2)) * 0.05
    quantized = quantize_rtn(weight, group_size, sym=sym, act_order=act_order)
    assert 0 <= quantized.weight.min() and quantized.weight.max() <= 15
    if sym:
        assert (quantized.zeros == 8).all()
    else:
        assert 1 <= quantized.zeros.min() and quantized.zeros.max() <= 15
    tensors = pack_gptq(quantized, None)
    assert_within_half_a_step(weight, tensors)
    groups = quantized.g_idx.long()
    direct = quantized.scales.float()[groups] * (quantized.weight.t().float() - quantized.zeros.float()[groups])
    assert torch.equal(dequantize_packed(tensors), direct.t())


def test_act_order_gives_a_non_monotone_g_idx() -> None:
    weight = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    g_idx = quantize_rtn(weight, 16, sym=True, act_order=True).g_idx
    assert (g_idx.diff() < 0).any()
    assert g_idx.bincount().tolist() == [16, 16, 16, 16]
    norms = weight.norm(dim=0)
    assert norms[g_idx == 0].min() >= norms[g_idx == 1].max()  # largest columns first


def test_rtn_never_needs_zero_point_zero() -> None:
    """v1 stores zero - 1, so a group with no negative weight must still get a zero >= 1."""
    weight = torch.rand(8, 16, generator=torch.Generator().manual_seed(4))
    weight[0] = 0.0
    quantized = quantize_rtn(weight, 8, sym=False, act_order=False)
    assert quantized.zeros.min() >= 1
    tensors = pack_gptq(quantized, None)
    assert_within_half_a_step(weight, tensors)
    assert (dequantize_packed(tensors)[0] == 0).all()


# --- checkpoints on a tiny Qwen2 -----------------------------------------------------------------

def tiny_qwen(tie: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(5)
    config = tiny_qwen_config(tie_word_embeddings=tie)
    return Qwen2ForCausalLM(config).eval()


def quantized_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(key.removesuffix(".qweight") for key in tensors if key.endswith(".qweight"))


@pytest.mark.parametrize(
    "spec", [GPTQSpec(group_size=16, desc_act=True, sym=False), GPTQSpec(group_size=-1)], ids=str
)
def test_checkpoint_loads_into_gptq_linears(tmp_path: Path, spec: GPTQSpec) -> None:
    original = tiny_qwen()
    write_gptq_checkpoint(original, tmp_path, spec)
    assert read_gptq_spec(json.loads((tmp_path / "config.json").read_text())) == spec
    assert read_gptq_spec(json.loads((tmp_path / "quantize_config.json").read_text())) == spec
    tensors = load_file(tmp_path / "model.safetensors")
    names = quantized_names(tensors)
    assert len(names) == 2 * 7  # q, k, v, o, gate, up, down in each layer
    for name in names:
        assert_within_half_a_step(original.get_submodule(name).weight.detach(), tensors, f"{name}.")
    assert {t.dtype for k, t in tensors.items() if k.rpartition(".")[0] not in names} == {torch.float16}

    quantized = Qwen2ForCausalLM(original.config).eval()
    replace_linears_with_gptq(quantized, names, spec)
    quantized.load_state_dict(tensors)

    plain = {k: t.float() for k, t in tensors.items() if k.rpartition(".")[0] not in names}
    for name in names:
        plain[f"{name}.weight"] = dequantize_packed(tensors, f"{name}.")
        if f"{name}.bias" in tensors:
            plain[f"{name}.bias"] = tensors[f"{name}.bias"].float()
    reference = Qwen2ForCausalLM(original.config).eval()
    reference.load_state_dict(plain)

    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = reference(tokens).logits
        torch.testing.assert_close(quantized(tokens).logits, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(original(tokens).logits, expected, atol=1e-5)  # it was quantized


def test_tied_embeddings_are_stored_once(tmp_path: Path) -> None:
    write_gptq_checkpoint(tiny_qwen(tie=True), tmp_path, GPTQSpec(group_size=16))
    tensors = load_file(tmp_path / "model.safetensors")
    assert "model.embed_tokens.weight" in tensors and "lm_head.weight" not in tensors
    quantized = tiny_qwen(tie=True)
    replace_linears_with_gptq(quantized, quantized_names(tensors), GPTQSpec(group_size=16))
    result = quantized.load_state_dict(tensors, strict=False)
    assert result.missing_keys == ["lm_head.weight"] and result.unexpected_keys == []
    assert quantized.lm_head.weight is quantized.model.embed_tokens.weight


def test_replace_builds_matching_layers_on_meta() -> None:
    with torch.device("meta"):
        model = Qwen2ForCausalLM(tiny_qwen().config)
    names = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj"]
    replace_linears_with_gptq(model, names, GPTQSpec(group_size=16))
    q_proj, o_proj, down = (model.get_submodule(name) for name in names)
    assert all(isinstance(layer, GPTQLinear) for layer in (q_proj, o_proj, down))
    assert (down.in_features, down.out_features) == (64, 32)
    assert down.qweight.shape == (8, 32) and down.qzeros.shape == (4, 4) and down.scales.shape == (4, 32)
    assert down.qweight.is_meta
    assert repr(down) == "GPTQLinear(in_features=64, out_features=32, groups=4)"  # as print(model) shows it
    assert q_proj.bias is not None and o_proj.bias is None  # Qwen2 has q/k/v biases only
    assert isinstance(model.get_submodule("model.layers.0.self_attn.k_proj"), torch.nn.Linear)
    replace_linears_with_gptq(model, ["model.layers.0.mlp.up_proj"], GPTQSpec(group_size=-1))
    assert model.get_submodule("model.layers.0.mlp.up_proj").scales.shape == (1, 64)


@pytest.mark.parametrize("name", ["model.layers.0.mlp", "model.layers.0.mlp.nope"])
def test_replace_refuses_what_is_not_a_linear(name: str) -> None:
    with pytest.raises(SpecchatError):
        replace_linears_with_gptq(tiny_qwen(), [name], GPTQSpec())


# --- reading the config ----------------------------------------------------------------------------

def test_reads_config_json_quantization_config() -> None:
    config = {
        "model_type": "llama",
        "quantization_config": {
            "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True,
            "damp_percent": 0.01, "checkpoint_format": "gptq",
        },
    }
    assert read_gptq_spec(config) == GPTQSpec(bits=4, group_size=128, desc_act=True, sym=True)


def test_reads_quantize_config_json() -> None:
    config = {
        "bits": 4, "group_size": -1, "damp_percent": 0.01, "desc_act": False, "sym": False,
        "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
    }
    assert read_gptq_spec(config) == GPTQSpec(bits=4, group_size=-1, desc_act=False, sym=False)


def test_settings_left_out_are_transformers_defaults() -> None:
    """A config naming only the method and bits reads as transformers' GPTQConfig would fill it."""
    defaults = inspect.signature(GPTQConfig).parameters
    expected = GPTQSpec(4, defaults["group_size"].default, defaults["desc_act"].default, defaults["sym"].default)
    assert read_gptq_spec({"quantization_config": {"quant_method": "gptq", "bits": 4}}) == expected == \
        GPTQSpec(4, 128, False, True)


@pytest.mark.parametrize(
    "config",
    [{"model_type": "qwen2"}, {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}],
)
def test_non_gptq_is_none(config: dict) -> None:
    assert read_gptq_spec(config) is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"bits": 8}, "only 4-bit"),
        ({"bits": 4, "checkpoint_format": "gptq_v2"}, "'gptq_v2'"),
        ({"bits": 4, "is_marlin_format": True}, "'marlin'"),
        ({"bits": 4, "group_size": 0}, "group_size 0"),
    ],
)
def test_unsupported_settings_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(SpecchatError, match=message):
        read_gptq_spec({"quantization_config": {"quant_method": "gptq", **settings}})
