"""A CPU's float32 linears through oneDNN (quant/onednn_float.py): a float32 GEMM's sums on the plain
weight; the module keeps its parameters and state_dict, inputs outside the measured span keep
F.linear, and the span is the machine's measured choice."""

import pytest
import torch
from helpers.dense_linears import prompt_logits, random_linear, tied_tiny_model
from torch import nn

from specchat.quant import onednn_float, timing, widths
from specchat.quant.int8 import Int8Linear
from specchat.quant.onednn_float import (
    BANK_WEIGHTS,
    ONEDNN_ROWS,
    PROBED_OUTPUTS,
    OneDnnLinear,
    onednn_linear,
    onednn_span,
    route,
    route_float32_linears,
)

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")



@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_the_float32_sum_up_to_its_order(rows, bias):
    """Against the float64 sums: within float32's error on a 512-term sum, as torch's own product is."""
    linear = random_linear(512, 384, bias, torch.float32)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(1))
    mine, torchs = onednn_linear(x, linear.weight, linear.bias).double(), linear(x).double()
    exact = x.double() @ linear.weight.double().t() + (linear.bias.double() if bias else 0)
    bound = 512 * torch.finfo(torch.float32).eps * (x.double().abs() @ linear.weight.double().abs().t())
    assert mine.shape == (rows, 384) and ((mine - exact).abs() <= bound).all()
    assert ((torchs - exact).abs() <= bound).all()


@needs_onednn
def test_a_routed_linear_multiplies_inside_its_span_only_and_stays_the_module_it_was(monkeypatch):
    linear = random_linear(64, 32, bias=True, dtype=torch.float32)
    weight, bias, keys = linear.weight, linear.bias, list(linear.state_dict())
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(3))
    plain = {rows: linear(x[:rows]) for rows in (1, 2, 8, 9)}
    same = route(linear, (2, 8))
    assert same is linear and isinstance(linear, OneDnnLinear) and isinstance(linear, nn.Linear)
    assert linear.weight is weight and linear.bias is bias and list(linear.state_dict()) == keys
    calls = []
    monkeypatch.setattr(onednn_float, "onednn_linear", lambda *args: calls.append(args[0].shape) or plain[2])
    assert torch.equal(linear(x[:1]), plain[1]) and torch.equal(linear(x[:9]), plain[9])  # F.linear, bit for bit
    assert not calls
    linear(x[:2]), linear(x[:8].view(2, 4, 64))  # rows, not dim 0
    assert calls == [(2, 64), (2, 4, 64)]
    assert "oneDNN at 2-8 rows" in repr(linear)




@needs_onednn
def test_a_routed_model_scores_as_before_within_float32_rounding(monkeypatch):
    monkeypatch.setattr(onednn_float, "onednn_span", lambda in_features, out_features, dtype: (2, 64))
    model = tied_tiny_model(torch.float32)
    before = prompt_logits(model)
    head = model.get_output_embeddings()
    # q, k, v, o, gate, up, down a layer, and the tied head
    assert route_float32_linears(model.modules(), CPU) == 2 * 7 + 1
    assert model.get_output_embeddings() is head and head.weight is model.get_input_embeddings().weight
    calls, product = [], onednn_float.onednn_linear
    monkeypatch.setattr(onednn_float, "onednn_linear", lambda *args: calls.append(1) or product(*args))
    after = prompt_logits(model)
    assert len(calls) == 2 * 7 + 1  # every linear of the 6-token pass, the head over its rows
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_nothing_routes_on_another_device_in_a_half_dtype_or_where_the_cpu_does_not_gain(monkeypatch):
    monkeypatch.setattr(onednn_float, "onednn_span",
                        lambda in_features, out_features, dtype: (2, 64) if dtype == torch.float32 else None)
    assert route_float32_linears(tied_tiny_model(torch.float32).modules(), torch.device("meta")) == 0
    assert route_float32_linears(tied_tiny_model(torch.bfloat16).modules(), CPU) == 0
    assert route_float32_linears(nn.Sequential(Int8Linear(torch.ones(8, 16), None)).modules(), CPU) == 0
    monkeypatch.setattr(onednn_float, "onednn_span", lambda *shape_and_dtype: None)
    model = tied_tiny_model(torch.float32)
    assert route_float32_linears(model.modules(), CPU) == 0
    assert not any(isinstance(m, OneDnnLinear) for m in model.modules())


@needs_onednn
def test_the_span_is_the_run_of_widths_the_timer_says_onednn_wins_for_the_shape(monkeypatch, tmp_path):
    """The choice, not the clock: a stand-in for `faster` that lets oneDNN (the first timed) win from
    2 to 32 rows, on a machine that has measured nothing yet; the next process there reads the
    choice, for every weight whose probed rows are the same (a head's rows past PROBED_OUTPUTS);
    bf16 is never timed."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    timed = []

    def stand_in(first, second, device) -> bool:
        mine, torchs = first(), second()
        rows = {product.shape for product in mine + torchs}
        assert len(rows) == 1 and all(product.dtype == torch.float32 for product in mine + torchs)
        (shape,) = rows
        timed.append(shape)
        return 2 <= shape[0] <= 32

    monkeypatch.setattr(timing, "faster", stand_in)
    onednn_float.probed_span.cache_clear()
    try:
        assert onednn_span(64, 20000, torch.bfloat16) is None and not timed
        assert onednn_span(64, 20000, torch.float32) == (2, 32)
        probed = ONEDNN_ROWS[:ONEDNN_ROWS.index(64) + 1]  # up to the first loss after the wins
        assert timed == [(rows, PROBED_OUTPUTS) for rows in probed]
        onednn_float.probed_span.cache_clear()  # another process on the same machine
        monkeypatch.setattr(timing, "faster", lambda first, second, device: pytest.fail("kept: nothing to time"))
        assert onednn_span(64, PROBED_OUTPUTS + 1, torch.float32) == (2, 32)
        assert widths.MEASURES["oneDNN float32 rows"] is onednn_float.measure_onednn_span  # doctor measures it again
    finally:
        onednn_float.probed_span.cache_clear()


@pytest.mark.parametrize(("in_features", "out_features", "copies"), [(16, 16, BANK_WEIGHTS), (1024, 1024, 16),
                                                                     (4096, 8192, 1)])
def test_a_probe_cycles_through_64_mb_of_weights_at_most_32_of_them_and_at_least_one(monkeypatch, in_features,
                                                                                     out_features, copies):
    """A 16 x 16 weight is 1 KB: 64 MB of them would be 65536 calls a trial; a 4 MB one takes 16 to
    fill the 64 MB; a 128 MB one is timed alone. The stand-in lets oneDNN win at one row only."""
    banks = []

    def stand_in(first, second, device) -> bool:
        banks.append((len(first()), len(second())))
        return len(banks) == 1

    monkeypatch.setattr(timing, "faster", stand_in)
    assert onednn_float.measure_onednn_span(in_features, out_features, torch.float32) == [1, 1]
    assert banks == [(copies, copies)] * 2  # one row, then two (the first loss)


def test_a_torch_without_the_kernel_measures_no_span(monkeypatch):
    def missing(*args):
        raise RuntimeError("no oneDNN inner product for this dtype")

    monkeypatch.setattr(onednn_float, "onednn_linear", missing)
    monkeypatch.setattr(timing, "faster", lambda first, second, device: pytest.fail("nothing to time"))
    assert onednn_float.measure_onednn_span(64, 256, torch.float32) is None
