"""A draft's linears in 8-bit floats (quant/fp8.py): the product of the rounded operands with
their row scales, the sizes _scaled_mm takes, the bytes the plan counts, and the devices it runs on."""

import pytest
import torch
from torch import nn

from specchat.quant import fp8
from specchat.quant.fp8 import (FP8, FP8_MAX, Fp8Linear, fp8_linears, fp8_runs_on, fp8_weight_bytes, quantize_rows,
                                scaled_product)


def rounded_product(linear: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """float64 sum_i (x / a)_fp8 (w / b)_fp8 a b: the operands as quantized, multiplied exactly."""
    rows, scale = quantize_rows(x.reshape(-1, linear.in_features))
    out = (rows.double() * scale.double()) @ (linear.weight.double() * linear.scale.double().t()).t()
    return out.view(*x.shape[:-1], linear.out_features)


@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_the_rounded_operands_times_their_scales(bias: bool):
    """A CPU's path (this module's forward here), its sums rounded to bf16 before the scales apply."""
    torch.manual_seed(0)
    dense = nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    linear = Fp8Linear(dense)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    out = linear(x)
    expected = rounded_product(linear, x) + (0 if dense.bias is None else dense.bias.double())
    assert out.shape == (2, 5, 48) and out.dtype == torch.bfloat16
    # two roundings into bf16: at most 0.0062 apart without the bias, 0.0086 with it (AMD EPYC, 2026-11-30)
    assert (out.double() - expected).abs().max() <= 0.017
    # fp8's rounding of both operands: 0.038 of the dense product's largest magnitude, either way (same machine)
    assert (out.float() - dense(x).float()).abs().max() <= 0.075 * dense(x).float().abs().max()


def test_cudas_product_applies_the_scales_to_the_float32_sums_and_rounds_once():
    """The path CUDA takes (_scaled_mm, which a CPU runs too, slowly)."""
    torch.manual_seed(1)
    linear = Fp8Linear(nn.Linear(64, 48, bias=False).to(torch.bfloat16))
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    quantized, scale = quantize_rows(x)
    out = scaled_product(quantized, scale, linear.weight, linear.scale, torch.bfloat16)
    # rounded once into bf16: at most 0.0035 apart (torch 2.13's CPU _scaled_mm, AMD EPYC, 2026-11-30)
    assert (out.double() - rounded_product(linear, x)).abs().max() <= 0.007


def test_a_rows_largest_magnitude_maps_to_448_and_a_row_of_zeros_to_zeros():
    rows = torch.tensor([[1.0, -3.0, 0.5, 2.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    quantized, scale = quantize_rows(rows)
    assert quantized.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (2, 1)
    assert quantized[0].float().abs().max() == FP8_MAX and quantized[0, 1].float() == -FP8_MAX
    assert torch.equal(quantized[1].float(), torch.zeros(4)) and scale[1] > 0  # no division by zero


def test_only_linears_of_multiples_of_16_are_replaced_and_hold_a_byte_a_weight_and_a_scale_a_row():
    block = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 24), nn.Sequential(nn.Linear(64, 16, bias=False)))
    sizes = [fp8_weight_bytes(block[0]), fp8_weight_bytes(block[2][0])]
    assert fp8_linears(block) == 2
    assert isinstance(block[0], Fp8Linear) and type(block[1]) is nn.Linear and isinstance(block[2][0], Fp8Linear)
    for linear, size in zip((block[0], block[2][0]), sizes):
        assert linear.weight.nbytes + linear.scale.nbytes == size == linear.weight.numel() + 4 * linear.out_features


def test_a_cpu_has_no_fp8_units():
    assert not fp8_runs_on(torch.device("cpu"))


@pytest.mark.parametrize("capability, runs", [((8, 6), False), ((8, 9), True), ((9, 0), True), ((7, 5), False)],
                         ids=["ampere", "ada", "hopper", "turing"])
def test_cuda_multiplies_fp8_from_ada_on(monkeypatch, capability, runs):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: asked.append(device) or capability)
    assert fp8_runs_on(torch.device("cuda:1")) == runs
    assert asked == [torch.device("cuda:1")]  # the capability of the device named, not the current one


def test_an_fp8_linear_is_for_inference():
    linear = Fp8Linear(nn.Linear(32, 16))
    assert not any(parameter.requires_grad for parameter in linear.parameters())


def test_a_weight_is_quantized_in_blocks_of_rows_as_it_would_be_whole(monkeypatch):
    torch.manual_seed(2)
    weight = torch.randn(40, 32, dtype=torch.bfloat16)
    whole = quantize_rows(weight)
    monkeypatch.setattr(fp8, "WEIGHT_ROWS", 16)
    blocks = fp8.quantize_weight(weight)
    assert all(torch.equal(a.float(), b.float()) for a, b in zip(whole, blocks))


def test_a_rows_scale_is_its_largest_magnitude_times_float32s_one_over_448():
    """The product CUDA computes for a division by a number (torch multiplies by the reciprocal
    there): one function on both devices, and fp8_rows' kernel's."""
    quantized, scale = quantize_rows(torch.tensor([[3.0, -1.0]]))
    reciprocal = torch.tensor(1 / FP8_MAX, dtype=torch.float32)
    assert reciprocal.item() == fp8.INVERSE_MAX and scale.item() == (torch.tensor(3.0) * reciprocal).item()
    assert scale.item() != (torch.tensor(3.0) / FP8_MAX).item()  # a division rounds 3/448 otherwise
