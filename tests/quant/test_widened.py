"""Dense half-precision products widened to float32 (quant/widened.py): a bf16 GEMM's sums, in chunks
of the weight's rows; the module keeps its parameters and state_dict, narrow inputs keep the half
kernel, and the rows it widens from are the machine's measured choice. A Q6_K linear's chunks
(quant/q6k_linear.py) widen from the same rows."""

import pytest
import torch
from helpers.allocations import record_allocations
from helpers.dense_linears import prompt_logits, random_linear, tied_tiny_model
from helpers.q6_linears import q6_linear
from torch import nn

from specchat.quant import prepacked, q6k_linear, timing, widened, widths
from specchat.quant.int8 import Int8Linear
from specchat.quant.prepacked import widen_linears
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.widened import (
    WIDENED_ROWS,
    WidenedLinear,
    chunk_rows,
    widen,
    widened_linear,
    widened_rows,
    widened_workspace,
)

CPU = torch.device("cpu")


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias in float64: the exact sums a bf16 GEMM rounds once."""
    out = x.double() @ weight.double().t()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_the_float32_sum_rounded_once_across_chunks(monkeypatch, dtype, bias):
    """Chunks of 3 output rows over 10 (the last one short): every row of every chunk lands in its
    own columns, with its bias, within one rounding of the exact sum (float32's own error on a
    64-term sum is far below a bf16 step)."""
    monkeypatch.setattr(widened, "CHUNK_WEIGHTS", 32)
    assert chunk_rows(64, 10) == 1  # a row wider than a chunk is converted alone
    monkeypatch.setattr(widened, "CHUNK_WEIGHTS", 3 * 64)
    assert chunk_rows(64, 10) == 3
    linear = random_linear(64, 10, bias, dtype)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = widened_linear(x, linear.weight, linear.bias)
    assert out.shape == (2, 5, 10) and out.dtype == dtype
    exact = reference(x.reshape(-1, 64), linear.weight, linear.bias).reshape(2, 5, 10)
    step = torch.finfo(dtype).eps * exact.abs()  # one rounding to `dtype` is at most half a step
    assert ((out.double() - exact).abs() <= step + 1e-6).all()


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_it_is_torchs_bf16_product_up_to_the_order_of_the_sums(rows):
    linear = random_linear(512, 384, bias=True, dtype=torch.bfloat16)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    mine, torchs = widened_linear(x, linear.weight, linear.bias).double(), linear(x).double()
    exact = reference(x, linear.weight, linear.bias)
    step = torch.finfo(torch.bfloat16).eps * exact.abs()
    assert ((mine - torchs).abs() <= step + 1e-6).all()  # both one rounding of nearly the same sum
    assert (mine == torchs).float().mean() > 0.95


def test_a_widened_linear_keeps_narrow_inputs_on_the_half_kernel_and_its_module_as_it_was(monkeypatch):
    linear = random_linear(64, 32, bias=True, dtype=torch.bfloat16)
    weight, bias = linear.weight, linear.bias
    keys = list(linear.state_dict())
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    narrow = linear(x[:3])
    same = widen(linear, from_rows=4)
    assert same is linear and isinstance(linear, WidenedLinear) and isinstance(linear, nn.Linear)
    assert linear.weight is weight and linear.bias is bias and list(linear.state_dict()) == keys
    widened_calls = []  # the rows of each widened product
    product = widened.widened_linear
    monkeypatch.setattr(widened, "widened_linear",
                        lambda *args: widened_calls.append(args[0][..., 0].numel()) or product(*args))
    assert torch.equal(linear(x[:3]), narrow) and not widened_calls  # 3 rows: nn.Linear's own forward, bit for bit
    assert torch.equal(linear(x[:4]), product(x[:4], weight, bias)) and widened_calls == [4]
    assert torch.equal(linear(x.view(2, 4, 64)), product(x, weight, bias).view(2, 4, 32))  # rows, not dim 0
    assert widened_calls == [4, 8]
    assert "widened from 4 rows" in repr(linear)


def test_a_model_widened_where_its_dtype_widens_scores_within_bf16_rounding(monkeypatch):
    monkeypatch.setattr(prepacked, "widened_rows", lambda dtype: 2)
    model = tied_tiny_model(torch.bfloat16)
    before = prompt_logits(model).float()
    head = model.get_output_embeddings()
    # q, k, v, o, gate, up, down a layer, and the tied head
    assert widen_linears(model.modules(), CPU, torch.bfloat16) == 2 * 7 + 1
    assert model.get_output_embeddings() is head and head.weight is model.get_input_embeddings().weight
    calls, product = [], widened.widened_linear
    monkeypatch.setattr(widened, "widened_linear", lambda *args: calls.append(1) or product(*args))
    after = prompt_logits(model).float()
    assert len(calls) == 2 * 7 + 1  # every linear of the 6-token pass, the head over its rows
    assert (after - before).abs().max() < 0.05 * before.abs().max()


def test_nothing_widens_on_another_device_in_float32_or_where_the_cpu_does_not_gain(monkeypatch):
    monkeypatch.setattr(prepacked, "widened_rows", lambda dtype: 2)
    assert widen_linears(tied_tiny_model(torch.bfloat16).modules(), torch.device("meta"), torch.bfloat16) == 0
    assert widen_linears(tied_tiny_model(torch.float32).modules(), CPU, torch.float32) == 0
    int8 = nn.Sequential(Int8Linear(torch.ones(8, 16), None))
    assert widen_linears(int8.modules(), CPU, torch.bfloat16) == 0
    monkeypatch.setattr(prepacked, "widened_rows", lambda dtype: None)
    model = tied_tiny_model(torch.bfloat16)
    assert widen_linears(model.modules(), CPU, torch.bfloat16) == 0
    assert not any(isinstance(m, WidenedLinear) for m in model.modules())


def test_the_rows_are_the_first_width_the_timer_says_widening_wins(monkeypatch, tmp_path):
    """The choice, not the clock: a stand-in for `faster` that lets the widened product (the first
    timed) win from 16 rows, on a machine that has measured nothing yet; the next process there
    reads the choice; float32 is never widened and never timed."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    timed = []

    def stand_in(first, second, device) -> bool:
        mine, torchs = first(), second()
        timed.append(mine.shape[0])
        assert mine.dtype == torchs.dtype == torch.bfloat16
        return mine.shape[0] >= 16

    monkeypatch.setattr(timing, "faster", stand_in)
    widened_rows.cache_clear()
    try:
        assert widened_rows(torch.float32) is None and not timed
        assert widened_rows(torch.bfloat16) == 16
        assert timed == list(WIDENED_ROWS[:WIDENED_ROWS.index(16) + 1])
        widened_rows.cache_clear()  # another process on the same machine
        monkeypatch.setattr(timing, "faster", lambda first, second, device: False)
        assert widened_rows(torch.bfloat16) == 16
        assert widths.MEASURES["widened rows"] is widened.measure_widened_rows  # doctor measures it again
    finally:
        widened_rows.cache_clear()


def test_the_workspace_bounds_what_a_call_allocates(monkeypatch):
    """Counted from the buffers' own sizes: a stand-in for torch.empty records every allocation."""
    linear = random_linear(96, 700, bias=False, dtype=torch.bfloat16)
    x = torch.randn(5, 96).to(torch.bfloat16)
    sizes = record_allocations(monkeypatch)
    out = widened_linear(x, linear.weight)
    allocated = sum(sizes) - out.nbytes + x.float().nbytes  # the widened input comes from .float()
    assert allocated <= widened_workspace(96, 700, 5)
    assert widened_workspace(96, 700, 5) == 4 * (5 * 96 + chunk_rows(96, 700) * 96 + 5 * chunk_rows(96, 700))


def test_a_widened_q6_linear_multiplies_the_weights_rounded_once_in_float32(monkeypatch):
    """Chunks of 24 rows over 80 (the last one short): from `widened_from` rows the product is the
    bf16 weights' float32 sums rounded once, across every chunk; below it, the bf16 kernel's as before."""
    monkeypatch.setattr(q6k_linear, "CHUNK_WEIGHTS", 24 * 512)
    linear, dequantized = q6_linear(80, 512)
    weight = dequantized.to(torch.bfloat16)  # as the bf16 model holds it
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    plain = linear(x)
    linear.widened_from = 6
    assert torch.equal(linear(x[:5]), plain[:5])  # 5 rows: the bf16 kernel, bit for bit
    out = linear(x)
    exact = reference(x, weight, None)  # the bf16 weights' exact sums
    assert ((out.double() - exact).abs() <= torch.finfo(torch.bfloat16).eps * exact.abs() + 1e-6).all()


def test_a_q6_linear_multiplies_in_float32_from_exactly_widened_from_rows(monkeypatch):
    """The rows decide the product's dtype, not how close its sums come out: a bf16 GEMM summing in
    float32 may round to the same bits."""
    linear, _ = q6_linear(32, 512)
    linear.widened_from = 6
    products, mm = [], torch.mm

    def recorded(inputs: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        products.append((inputs.shape[0], inputs.dtype))
        return mm(inputs, *args, **kwargs)

    monkeypatch.setattr(torch, "mm", recorded)
    for rows in (5, 6, 7):
        linear(torch.randn(rows, 512).to(torch.bfloat16))
    assert products == [(5, torch.bfloat16), (6, torch.float32), (7, torch.float32)]


def test_the_walk_widens_a_models_q6_linears_for_its_dtype(monkeypatch):
    monkeypatch.setattr(prepacked, "widened_rows", lambda dtype: 4 if dtype == torch.bfloat16 else None)
    model = nn.Sequential(Q6Linear(512, 32), Q6Linear(512, 16))
    assert widen_linears(model.modules(), CPU, torch.float32) == 0 and model[0].widened_from == float("inf")
    assert widen_linears(model.modules(), CPU, torch.bfloat16) == 2 and model[1].widened_from == 4
