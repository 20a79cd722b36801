"""Dense copies of the 4-bit linears for wide inputs (quant/int4_dense.py): the copy is the packed
weight rounded once to the compute dtype, wide inputs multiply it and narrow ones keep the fused
kernel's bits, the crossover follows what the timer measures, copies stay within their room and out
of state_dict, and the plan counts them only where every layer is in memory and the room is left;
a draft stored in 4 bits expanded (`expand_linears`) multiplies the same weights."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.int4_weights import random_weight
from torch import nn

from specchat.plan.machine import Machine
from specchat.plan.pair import plan_pair
from specchat.plan.request import Pair, PlanRequest
from specchat.quant import int4_dense, timing, widths
from specchat.quant.int4 import int4_linear, use_fused_only
from specchat.quant.int4_dense import dense_copy_bytes, expand, expand_linears, keep_dense_copies
from specchat.quant.int4_pack import fused_linear
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.widths import DENSE_ROWS, UNLIMITED, WidthChoice, dense_rows

CPU = torch.device("cpu")
GB = 10**9
OUT, IN = 128, 256


def rounded_scales(weight: Int4Weight, dtype: torch.dtype) -> Int4Weight:
    """The weight whose scales and zeros are what a `dtype` kernel holds (rounded once at packing)."""
    return replace(weight, scales=weight.scales.to(dtype).float(), zeros=weight.zeros.to(dtype).float())


@pytest.fixture
def every_shape_gains(monkeypatch):
    """A timer stand-in: the dense copy wins from 16 rows at every shape, whatever this CPU measures."""
    monkeypatch.setattr(int4_dense, "dense_rows", lambda in_features, out_features, dtype: 16)


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_copy_is_the_packed_weight_rounded_once(group, act_order, dtype):
    weight = random_weight(out_features=320, in_features=512, group=group, act_order=act_order)
    linear = int4_linear(weight, None, dtype, CPU)
    exact = rounded_scales(weight, dtype).dequantize()  # over the layer's inputs
    over_weight_inputs = exact if weight.perm is None else exact[:, weight.perm]
    assert torch.equal(expand(linear), over_weight_inputs.to(dtype))


def test_a_cpu_copy_never_runs_the_triton_kernel_even_where_the_interpreter_could(monkeypatch):
    """Triton's interpreter runs the expansion kernel on a CPU (how the tests check it), orders of
    magnitude slower than torch's ops and to the same bits: a CPU's copies take torch's ops alone."""
    pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")
    from specchat.triton_support import triton_available

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_available()
    monkeypatch.setattr(int4_dense, "expand_int4", lambda *args: pytest.fail("a CPU copy ran the Triton kernel"))
    weight = random_weight(out_features=OUT, in_features=IN)
    copy = expand(int4_linear(weight, None, torch.bfloat16, CPU))
    assert torch.equal(copy, rounded_scales(weight, torch.bfloat16).dequantize().to(torch.bfloat16))


@pytest.mark.parametrize("act_order", [False, True])
def test_expanded_linears_multiply_the_packed_weights_over_the_layers_inputs(act_order):
    weight = random_weight(out_features=OUT, in_features=IN, act_order=act_order)
    torch.manual_seed(0)
    bias = torch.randn(OUT)
    layer = nn.Sequential(int4_linear(weight, bias, torch.float32, CPU), nn.ReLU())
    x = torch.randn(5, IN)
    with torch.no_grad():
        packed = layer(x)
        assert expand_linears(layer) == 1 and type(layer[0]) is nn.Linear
        assert torch.equal(layer[0].weight, weight.dequantize())  # float32: the stored weights themselves
        # float32, outputs up to ~7, the fused kernel and the dense product summing in different orders:
        # at most 3.8e-6 apart on the AMX Xeon (2026-12-05; 2.9e-6 on the AMD EPYC, 2026-11-29)
        torch.testing.assert_close(layer(x), packed, rtol=0, atol=7.6e-6)


def test_wide_inputs_multiply_the_copy_and_narrow_ones_keep_the_fused_kernels_bits(every_shape_gains):
    weight = random_weight(out_features=OUT, in_features=IN, act_order=True)
    bias = torch.randn(OUT).bfloat16()
    linear = int4_linear(weight, bias.float(), torch.bfloat16, CPU)
    assert keep_dense_copies(linear, room=OUT * IN * 2) == OUT * IN * 2
    copy = expand(linear)
    narrow, wide = torch.randn(15, IN).bfloat16(), torch.randn(16, IN).bfloat16()
    with torch.inference_mode():
        permuted = wide.index_select(1, weight.perm)
        assert torch.equal(linear(wide), torch.nn.functional.linear(permuted, copy) + bias)
        fused = fused_linear(narrow.index_select(1, weight.perm), linear.packed, linear.scales_and_zeros, 32) + bias
        assert torch.equal(linear(narrow), fused)
    # nothing streams or saves the copy
    assert set(linear.state_dict()) == {"packed", "scales_and_zeros", "perm", "bias"}


def test_fused_only_drops_the_copy(every_shape_gains):
    linear = int4_linear(random_weight(), None, torch.bfloat16, CPU)
    keep_dense_copies(linear, room=GB)
    assert linear.dense is not None
    use_fused_only(linear)
    assert linear.dense is None


def test_copies_are_kept_in_order_while_they_fit_the_room(every_shape_gains):
    model = torch.nn.Sequential(*(int4_linear(random_weight(seed=seed), None, torch.bfloat16, CPU)
                                  for seed in range(3)))
    one = OUT * IN * 2
    assert dense_copy_bytes(model) == 3 * one
    assert keep_dense_copies(model, room=2 * one + one // 2) == 2 * one
    assert [linear.dense is not None for linear in model] == [True, True, False]


def test_the_crossover_is_the_first_width_the_timer_says_the_copy_wins(monkeypatch, tmp_path):
    """The choice, not the clock: a stand-in for `faster` that runs the copy and the fused kernel at
    each width, checks that they agree, and lets the copy win from 8 rows on, on a machine that has
    measured nothing yet; the next process there reads the choice."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    monkeypatch.setattr(widths, "width_choice", lambda device_type, dtype: WidthChoice(UNLIMITED, dtype))
    monkeypatch.setattr(widths, "prepack_pays", lambda dtype: False)  # the copy a plain nn.Linear, unmeasured
    calls = []

    def stand_in(first, second, device) -> bool:
        copy, fused = first(), second()
        calls.append(device)
        assert copy.shape == fused.shape == (DENSE_ROWS[len(calls) - 1], 128)
        # bf16 outputs of sums in other orders: |a - b| / (1 + |b|) at most 0.0058 (the AMD EPYC, 2026-12-06); bound 2x
        assert torch.allclose(copy.float(), fused.float(), rtol=0.0116, atol=0.0116)
        return DENSE_ROWS[len(calls) - 1] >= 8

    monkeypatch.setattr(timing, "faster", stand_in)
    dense_rows.cache_clear()
    try:
        assert dense_rows(256, 128, torch.bfloat16) == 8
        assert calls == [CPU] * DENSE_ROWS.index(8) + [CPU]
        monkeypatch.setattr(timing, "faster", lambda first, second, device: False)
        assert dense_rows(512, 128, torch.bfloat16) is None
        dense_rows.cache_clear()  # another process on the same machine
        assert dense_rows(256, 128, torch.bfloat16) == 8
    finally:
        dense_rows.cache_clear()


def plan_in(ram_gb: float, tier: str = "auto", dense_copies: bool = True):
    """Llama-2-70B-GPTQ (the shipped alias's config: 4-bit linears) on a described CPU machine."""
    plan = PlanRequest(tier=tier, offload_dir=Path("/nonexistent"), tree_tokens=1025, dense_copies=dense_copies,
                       resident_layers=0 if tier == "disk" else None)
    return plan_pair(Pair("llama-2-70b-gptq", torch.bfloat16, context=4096), plan, Machine(ram_gb=ram_gb))


def test_the_plan_counts_the_copies_where_every_layer_is_in_memory_and_room_is_left(every_shape_gains):
    # 80 layers of 4-bit linears: q and o 8192 x 8192, k and v 1024 x 8192, gate, up 28672 x 8192 and down; bf16
    copies = 80 * (2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192) * 2
    ample = plan_in(256)
    assert ample.dense_copies == copies
    (item,) = [i for i in ample.items if i.what.startswith("dense copies")]
    assert item.nbytes == copies and item.tier == "device"
    without = plan_in(256, dense_copies=False)
    assert without.dense_copies == 0 and ample.total("device") == without.total("device") + copies
    overhead = 256 * GB - ample.rooms.device  # the runtime and the OS, outside the plan's room
    tight = plan_in((overhead + without.total("device") + copies // 2) / GB)  # the rest fits, the copies do not
    assert tight.dense_copies == 0 and not tight.placement.streamed
    assert plan_in(256, tier="disk").dense_copies == 0  # streamed layers keep one stored form
