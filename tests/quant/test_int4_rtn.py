"""--draft-quant int4: a dense linear rounded to 4 bits per group (quant/int4_rtn.py)."""

import pytest
import torch
from torch import nn

from specchat.quant import int4_rtn
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_pack import pack_nibbles
from specchat.quant.int4_rtn import group_for, round_linears, rounded

CPU = torch.device("cpu")


def test_each_weight_moves_by_at_most_half_its_groups_step():
    torch.manual_seed(0)
    weight = torch.randn(64, 256) * torch.rand(64, 1) * 3
    four_bit = rounded(weight, 128)
    step = four_bit.scales.t().repeat_interleave(128, 1)  # [O, I]: each weight's group's scale
    assert four_bit.group_size == 128 and four_bit.scales.shape == (2, 64)
    # no slack: the largest error measured 1.0e-5 below half a step (the AMD EPYC, 2026-11-28)
    assert torch.all((four_bit.dequantize() - weight).abs() <= step / 2)
    lo = weight.reshape(64, 2, 128).amin(-1).t()  # a group's smallest weight is its grid's first point
    assert torch.allclose(four_bit.zeros - 8 * four_bit.scales, lo)


def test_a_weight_on_a_4_bit_grid_comes_back_exactly():
    torch.manual_seed(1)
    q = torch.randint(0, 16, (32, 64))
    q[:, 0], q[:, 32], q[:, 1], q[:, 33] = 0, 0, 15, 15  # each group spans the whole grid
    scale, lo = 0.25, -2.0
    weight = q.float() * scale + lo
    four_bit = rounded(weight, 32)
    assert torch.equal(four_bit.nibbles, pack_nibbles(q))
    assert torch.equal(four_bit.dequantize(), weight)


def test_a_constant_group_is_exact():
    weight = torch.full((16, 32), 0.75)
    assert torch.equal(rounded(weight, 32).dequantize(), weight)


@pytest.mark.parametrize(("in_features", "group"), [(256, 128), (192, 64), (96, 32), (48, None)])
def test_the_group_is_128_or_the_largest_smaller_one_that_divides_the_inputs(in_features, group):
    assert group_for(nn.Linear(in_features, 64), CPU) == group


def test_round_linears_replaces_what_the_kernels_take_and_multiplies_like_the_rounded_weight():
    torch.manual_seed(2)
    block = nn.Sequential(nn.Linear(256, 64, bias=True), nn.ReLU(), nn.Sequential(nn.Linear(48, 64)))
    expected = rounded(block[0].weight, 128).dequantize()
    assert round_linears(block, torch.float32, CPU) == 1
    assert isinstance(block[0], Int4Linear) and isinstance(block[2][0], nn.Linear)  # 48 inputs: no group fits
    x = torch.randn(5, 256)
    # float32 sums in another order, outputs up to 1.6: at most 7.2e-7 apart on the AMX Xeon (2026-12-05;
    # 4.8e-7 on the AMD EPYC, 2026-11-28)
    assert torch.allclose(block[0](x), x @ expected.t() + block[0].bias, atol=1.4e-6, rtol=0)


def test_a_weight_rounded_a_block_of_rows_at_a_time_is_the_weight_rounded_whole(monkeypatch):
    torch.manual_seed(3)
    weight = torch.randn(600, 128)  # blocks of 256, 256 and 88 rows
    blocked = rounded(weight, 64)
    monkeypatch.setattr(int4_rtn, "ROUND_ROWS", 1024)
    whole = rounded(weight, 64)
    assert torch.equal(blocked.nibbles, whole.nibbles) and torch.equal(blocked.scales, whole.scales)
    assert torch.equal(blocked.zeros, whole.zeros) and blocked.scales.shape == (2, 600)
