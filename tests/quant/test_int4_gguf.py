"""GGUF tensors into the packed path: Q4_K blocks become an Int4Weight whose float32 kernel weights
are gguf's own dequantization bitwise (within a stated bound when d and dmin are far apart); Q6_K
and Q8_0 are dequantized exactly, to be held dense."""

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quants
from helpers.gguf_files import random_blocks

from specchat.errors import SpecchatError
from specchat.quant.gguf_int4 import Q4_K_BYTES, dequantized, matches, q4k_scale_parts, q4k_to_int4
from specchat.quant.int4 import int4_linear, int4_tensors
from specchat.quant.int4_pack import fused_linear
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.q4k_scales import Q4KScalesLinear, q4k_entries

CPU = torch.device("cpu")


def test_q4k_blocks_convert_to_gguf_own_weights_bitwise():
    data = random_blocks(GGMLQuantizationType.Q4_K, 64, 1024)
    reference = torch.from_numpy(quants.dequantize(data, GGMLQuantizationType.Q4_K))
    weight = q4k_to_int4(data)
    assert weight.group_size == 32 and weight.perm is None
    assert torch.equal(weight.dequantize(), reference)
    tensors = int4_tensors(weight, None, torch.float32, CPU)
    kernel_weight = fused_linear(torch.eye(1024), tensors["packed"], tensors["scales_and_zeros"], 32).t()
    assert torch.equal(kernel_weight, reference)


def bound_terms(weight: Int4Weight, dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stated bound's two terms at each weight, float64: 2**-24 |zero| and 2**-23 |w|."""
    zeros = weight.zeros.double().repeat_interleave(weight.group_size, 0).t()
    return 2**-24 * zeros.abs(), 2**-23 * dense.double().abs()


def test_q4k_with_d_and_dmin_far_apart_stays_within_the_stated_bound():
    """zero = 8 d sc - dmin m is rounded to float32 when d and dmin are far apart in size; the
    weight then moves by at most 2**-24 |zero| (that rounding) plus 2**-23 |w| (its own rounding,
    in gguf's dequantization and in the kernel)."""
    data = random_blocks(GGMLQuantizationType.Q4_K, 64, 1024, seed=1, scale_range=(1e-7, 1e2))
    reference = torch.from_numpy(quants.dequantize(data, GGMLQuantizationType.Q4_K)).double()
    weight = q4k_to_int4(data)
    error = (weight.dequantize().double() - reference).abs()
    assert (error <= sum(bound_terms(weight, reference))).all()
    assert error.max() > 0  # the case does arise


@pytest.mark.parametrize("term", ["zero", "weight"])
def test_a_dense_weight_matches_within_the_bound_and_no_further(term):
    """`matches` accepts a dense weight off by 0.9 of the stated bound at one element and refuses
    one off by 1.1 of it, where the bound's `term` (2**-24 |zero| or 2**-23 |w|) is the larger."""
    data = random_blocks(GGMLQuantizationType.Q4_K, 64, 1024, seed=1, scale_range=(1e-7, 1e2))
    weight = q4k_to_int4(data)
    packed = weight.dequantize().double()
    zero_term, weight_term = bound_terms(weight, packed)
    ratio = zero_term / weight_term if term == "zero" else weight_term / zero_term
    index = divmod(int(ratio.argmax()), packed.shape[1])
    assert ratio[index] > 4
    bound = float(zero_term[index] + weight_term[index])
    assert matches(weight, packed)
    for share, matched in ((0.9, True), (1.1, False)):
        moved = packed.clone()
        moved[index] += share * bound
        assert matches(weight, moved) == matched
    assert not matches(weight, packed[:, :-32])  # another shape


def test_a_gguf_file_tensor_converts_as_its_blocks(tmp_path: Path):
    data = random_blocks(GGMLQuantizationType.Q4_K, 32, 512, seed=2)
    writer = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("blk.0.ffn_up.weight", data, raw_dtype=GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = GGUFReader(tmp_path / "m.gguf").tensors[0]
    assert tensor.data.shape == (32, 2 * Q4_K_BYTES)
    assert torch.equal(q4k_to_int4(tensor.data).dequantize(), q4k_to_int4(data).dequantize())


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0])
def test_types_without_a_4bit_kernel_dequantize_exactly(qtype):
    data = random_blocks(qtype, 32, 512, seed=3)
    weight = dequantized(data, qtype)
    assert weight.dtype == torch.float32 and weight.shape == (32, 512)
    assert torch.equal(weight, torch.from_numpy(quants.dequantize(data, qtype)))
    # held in bf16 (8 significant bits), each weight moves by at most 2**-8 of itself
    assert ((weight.bfloat16().float() - weight).abs() <= 2**-8 * weight.abs()).all()


def test_q4k_is_not_dequantized_by_mistake():
    with pytest.raises(SpecchatError, match="q4k_to_int4"):
        dequantized(random_blocks(GGMLQuantizationType.Q4_K, 16, 256), GGMLQuantizationType.Q4_K)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale_range", [(1e-4, 1e-3), (1e-7, 1e2)], ids=["near", "far-apart"])
def test_q4k_scale_parts_make_the_packed_scales_and_zeros_bitwise(dtype, scale_range):
    """A layer streamed compact makes its scales and zeros from Q4_K's parts on each call
    (quant/q4k_scales.py): the very pairs Int4Linear's packing stores, in either dtype, also where
    d and dmin are far apart and zero is rounded."""
    data = random_blocks(GGMLQuantizationType.Q4_K, 64, 1024, seed=5, scale_range=scale_range)
    tensors = int4_tensors(q4k_to_int4(data), None, dtype, CPU)
    compact = Q4KScalesLinear(1024, 64, 32, False, False, dtype, CPU)
    parts = {name.removeprefix("layer."): part for name, part in q4k_entries("layer", data).items()}
    compact.load_state_dict({"packed": tensors["packed"]} | parts)  # its buffers shaped as a checkpoint stores them
    assert torch.equal(compact.group_scales(), tensors["scales_and_zeros"])
    x = torch.randn(3, 1024, dtype=dtype)
    assert torch.equal(compact(x), int4_linear(q4k_to_int4(data), None, dtype, CPU)(x))  # the same path, the same sums
    stored = sum(t.numel() * t.element_size() for t in q4k_scale_parts(data))
    assert stored == 64 * 1024 // 32 * 2 + 64 * 1024 // 256 * 4  # 2.5 bytes a group, against bf16's 4
