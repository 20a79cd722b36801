"""Float32 dense copies (quant/float32_copies.py, int4_dense.copy_choice): kept where a copy in the
compute dtype never pays, holding the packed weights exactly; wide bf16 inputs are cast to float32
and the product back, narrow ones keep the fused kernel's bits; the plan counts 4 bytes a weight;
the crossover follows what the timer measures and is kept per machine."""

import pytest
import torch
from helpers.int4_weights import random_weight

from specchat.quant import float32_copies, int4_dense, timing
from specchat.quant.float32_copies import float32_copy_rows, float32_linear
from specchat.quant.int4 import int4_linear
from specchat.quant.int4_dense import CopyChoice, copy_choice, dense_copy_bytes, keep_dense_copies
from specchat.quant.int4_pack import fused_linear
from specchat.quant.widths import DENSE_ROWS

CPU = torch.device("cpu")
OUT, IN = 128, 256


@pytest.fixture
def only_float32_gains(monkeypatch):
    """Timer stand-ins, as on a CPU without bf16 instructions: a bf16 copy never wins, a float32
    one from 16 rows."""
    monkeypatch.setattr(int4_dense, "dense_rows", lambda in_features, out_features, dtype: None)
    monkeypatch.setattr(int4_dense, "float32_copy_rows", lambda in_features, out_features, dtype: 16)


def test_a_copy_in_the_compute_dtype_is_taken_where_it_pays_and_float32_is_not_measured(monkeypatch):
    asked = []
    monkeypatch.setattr(int4_dense, "dense_rows", lambda i, o, dtype: 4)
    monkeypatch.setattr(int4_dense, "float32_copy_rows", lambda i, o, dtype: asked.append(dtype) or 16)
    assert copy_choice(IN, OUT, torch.bfloat16) == CopyChoice(4, torch.bfloat16) and not asked


def test_float32_is_the_copy_where_the_compute_dtypes_never_pays(only_float32_gains):
    assert copy_choice(IN, OUT, torch.bfloat16) == CopyChoice(16, torch.float32)
    assert copy_choice(IN, OUT, torch.float32) is None  # a float32 model's own copy never paid


def test_the_float32_copy_holds_the_packed_weights_and_multiplies_wide_rows_in_float32(only_float32_gains):
    weight = random_weight(out_features=OUT, in_features=IN, act_order=True)
    bias = torch.randn(OUT).bfloat16()
    linear = int4_linear(weight, bias.float(), torch.bfloat16, CPU)
    assert dense_copy_bytes(linear) == OUT * IN * 4
    assert keep_dense_copies(linear, room=OUT * IN * 4) == OUT * IN * 4
    copy = linear.dense
    assert copy.dtype == torch.float32 and copy.from_rows == 16
    exact = int4_dense.expand(linear, torch.float32)
    # the float32 weights are (q - 8) * scale + zero with the kernel's bf16 scales, not rounded to bf16
    assert not torch.equal(exact, exact.bfloat16().float())
    narrow, wide = torch.randn(15, IN).bfloat16(), torch.randn(16, IN).bfloat16()
    with torch.inference_mode():
        permuted = wide.index_select(1, weight.perm)
        product = float32_linear(exact)(permuted.float())
        assert torch.equal(linear(wide), product.bfloat16() + bias)
        torch.testing.assert_close(product, torch.nn.functional.linear(permuted.float(), exact), rtol=1e-5, atol=1e-5)
        fused = fused_linear(narrow.index_select(1, weight.perm), linear.packed, linear.scales_and_zeros, 32) + bias
        assert torch.equal(linear(narrow), fused)


def test_float32_copies_are_kept_while_they_fit_the_room(only_float32_gains):
    linears = (int4_linear(random_weight(seed=seed), None, torch.bfloat16, CPU) for seed in range(2))
    model = torch.nn.Sequential(*linears)
    one = OUT * IN * 4
    assert keep_dense_copies(model, room=one + one // 2) == one
    assert [linear.dense is not None for linear in model] == [True, False]


def test_the_float32_crossover_is_the_first_width_the_timer_says_it_wins(monkeypatch, tmp_path):
    """The choice, not the clock: a stand-in for `faster` lets the float32 copy win from 8 rows on,
    on a machine that has measured nothing yet; the next process there reads the choice."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    calls = []

    def stand_in(first, second, device) -> bool:
        calls.append(device)
        return DENSE_ROWS[len(calls) - 1] >= 8

    monkeypatch.setattr(timing, "faster", stand_in)
    float32_copy_rows.cache_clear()
    try:
        assert float32_copy_rows(256, 128, torch.bfloat16) == 8
        assert calls == [CPU] * (DENSE_ROWS.index(8) + 1)
        monkeypatch.setattr(timing, "faster", lambda first, second, device: False)
        assert float32_copy_rows(512, 128, torch.bfloat16) is None
        float32_copy_rows.cache_clear()  # another process on the same machine
        assert float32_copy_rows(256, 128, torch.bfloat16) == 8
    finally:
        float32_copy_rows.cache_clear()


def test_the_measured_float32_copy_is_the_product_the_linear_runs(monkeypatch):
    """measure times float32_linear, the copy keep_dense_copies builds: prepacked where oneDNN
    takes a float32 weight."""
    built = []

    def copy_wins(first, second, device) -> bool:
        first(), second()
        return True

    monkeypatch.setattr(float32_copies, "float32_linear",
                        lambda weight: built.append(weight.dtype) or (lambda x: x @ weight.T))
    monkeypatch.setattr(timing, "faster", copy_wins)
    assert float32_copies.measure(256, 128, torch.bfloat16) == DENSE_ROWS[0] and built == [torch.float32]
