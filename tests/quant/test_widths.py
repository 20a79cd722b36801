"""quant/widths.py, the width policy. Its routing: which product `int4_product` hands an Int4Linear's
input to, by its width, its device and what the linear holds. The products are stand-ins that
record the call, so the order of the rules is tested alone: a dense copy first (from its rows), then
on CUDA a draft's registers (within the measured span), then the expansion (from its measured rows),
then the width choice (pinned or measured) between the fused kernel and the chunked product. Then
the choices made without a probe (no readable layout, no kernel for a dtype, no oneDNN), and what
the probes race. The products themselves are tested in their own modules' tests, and each probe's
decision from a timer stand-in beside its product's (test_int4, test_int4_dense, test_int4_gemm,
test_int8_rows, test_prepacked, test_onednn_float)."""

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor

from specchat.quant import timing, widths
from specchat.quant.int4 import Int4Linear, use_fused_only, use_registers
from specchat.quant.int4_dense import DenseCopy
from specchat.quant.widths import UNLIMITED, WidthChoice, int4_product

IN, OUT, GROUP = 256, 128, 32
SPAN = (16, 64)  # the rows over which the draft's kernel measured fastest (gemm_span)
EXPAND_FROM = 64  # the rows from which the expansion measured fastest (expand_rows)
MEASURED = WidthChoice(8, torch.float32)  # what width_choice measured for an unpinned linear


@pytest.fixture
def served(monkeypatch) -> list[tuple[str, int, object]]:
    """(product, rows, what it was told) of every call int4_product makes, each product a stand-in
    that returns a tensor of the product's own value, and every measurement the figures above."""
    calls: list[tuple[str, int, object]] = []

    def stand_in(name: str, told: Callable[..., object]) -> Callable[..., Tensor]:
        def product(flat: Tensor, *rest) -> Tensor:
            calls.append((name, flat.shape[0], told(*rest)))
            return torch.full((flat.shape[0], OUT), float(len(name)))
        return product

    monkeypatch.setattr(widths, "w4a16_tiled_linear", stand_in("registers", lambda *rest: rest[2]))
    monkeypatch.setattr(widths, "expanded_linear", stand_in("expansion", lambda *rest: rest[2]))
    monkeypatch.setattr(widths, "packed_product", stand_in("packed", lambda *rest: rest[-1]))
    monkeypatch.setattr(widths, "gemm_span", lambda *shape: SPAN)
    monkeypatch.setattr(widths, "expand_rows", lambda *shape: EXPAND_FROM)
    monkeypatch.setattr(widths, "width_choice", lambda device_type, dtype: MEASURED)
    return calls


def routed(linear: Int4Linear, served: list, rows: int) -> str:
    """The product that served `rows` rows (after checking that int4_product returned its output)."""
    out = int4_product(linear, torch.zeros(rows, IN, dtype=torch.bfloat16), linear.scales_and_zeros)
    name = served[-1][0]
    assert out.shape == (rows, OUT) and torch.equal(out, torch.full((rows, OUT), float(len(name))))
    return name


def cuda_linear() -> Int4Linear:
    """An Int4Linear packed for CUDA, its buffers on the CPU: int4_product is only asked which product serves it."""
    return Int4Linear(IN, OUT, GROUP, False, False, torch.bfloat16, torch.device("cuda"))


def test_a_cuda_targets_linear_runs_the_expansion_from_its_rows_and_the_width_choice_below(served):
    linear = cuda_linear()
    assert [routed(linear, served, rows) for rows in (1, 16, 63, 64, 1024)] == ["packed"] * 3 + ["expansion"] * 2
    assert served[0][2] is MEASURED  # the measured choice, for the linear's own device and dtype
    assert served[-1][2] == GROUP  # the expansion is given the linear's groups


def test_a_cuda_drafts_linear_runs_its_registers_over_the_span_before_the_expansion(served):
    linear = cuda_linear()
    use_registers(linear)
    names = [routed(linear, served, rows) for rows in (1, 15, 16, 64, 65, 256)]
    assert names == ["packed", "packed", "registers", "registers", "expansion", "expansion"]
    assert served[2][2] == GROUP


def test_a_pinned_linear_runs_its_pinned_choice_at_every_width(served):
    linear = cuda_linear()
    use_registers(linear)
    use_fused_only(linear)
    assert [routed(linear, served, rows) for rows in (1, 16, 64, 1024)] == ["packed"] * 4
    assert {told for _, _, told in served} == {WidthChoice(UNLIMITED, torch.bfloat16)}


def test_a_dense_copy_serves_from_its_rows_before_any_other_product(served):
    linear = cuda_linear()
    use_registers(linear)
    copy = torch.nn.Linear(IN, OUT, bias=False, dtype=torch.bfloat16)
    linear.dense = DenseCopy(copy, from_rows=32)
    out = int4_product(linear, torch.ones(32, IN, dtype=torch.bfloat16), linear.scales_and_zeros)
    assert torch.equal(out, copy(torch.ones(32, IN, dtype=torch.bfloat16))) and not served
    assert routed(linear, served, 31) == "registers"


def test_a_cpu_linear_runs_no_triton_product_at_any_width(served):
    linear = Int4Linear(IN, OUT, GROUP, False, False, torch.bfloat16, torch.device("cpu"))
    use_registers(linear)
    assert [routed(linear, served, rows) for rows in (1, 16, 64, 1024)] == ["packed"] * 4


@pytest.fixture
def unmeasured(monkeypatch) -> Iterator[None]:
    """Fails a test that reaches a kept choice or its probe; clears the process's cached choices around it."""
    def refuse(choice: str, key: dict) -> None:
        raise AssertionError(f"{choice} was measured or read for {key}")

    monkeypatch.setattr(widths, "kept", refuse)
    cached = (widths.width_choice, widths.expand_rows, widths.prepack_pays, widths.gemm_span, widths.dense_rows)
    for choice in cached:
        choice.cache_clear()
    yield
    for choice in cached:
        choice.cache_clear()


def test_past_the_fused_rows_the_chunks_serve_unless_the_layout_cannot_be_read_back(monkeypatch):
    calls = []
    monkeypatch.setattr(widths, "fused_linear", lambda flat, *rest: calls.append(("fused", flat.shape[0])))
    monkeypatch.setattr(widths, "chunked_linear",
                        lambda flat, *rest: calls.append(("chunked", flat.shape[0], rest[-1])))
    packed, scales, layout = torch.empty(0), torch.empty(0), widths.layout_for(widths.CPU, IN)
    for rows in (8, 9):
        widths.packed_product(torch.zeros(rows, IN), packed, scales, GROUP, layout, MEASURED)
        widths.packed_product(torch.zeros(rows, IN), packed, scales, GROUP, None, MEASURED)
    assert calls == [("fused", 8), ("fused", 8), ("chunked", 9, torch.float32), ("fused", 9)]


def test_where_the_layout_cannot_be_read_back_the_fused_kernel_serves_every_width_unmeasured(monkeypatch, unmeasured):
    monkeypatch.setattr(widths, "layout_for", lambda device, in_features: None)
    assert widths.width_choice("cpu", torch.bfloat16) == WidthChoice(UNLIMITED, torch.bfloat16)
    with pytest.raises(widths.SpecchatError, match="no int4 product for torch.float16 on cuda"):
        widths.width_choice("cuda", torch.float16)  # CUDA's fused kernel takes bf16 inputs only
    assert widths.dense_rows(IN, OUT, torch.bfloat16) is None  # no copy to make


def test_the_expansion_serves_every_width_where_the_fused_kernel_takes_no_inputs_of_the_dtype(monkeypatch, unmeasured):
    monkeypatch.setattr(widths, "tiles_readable", lambda device_type, in_features: True)
    assert widths.expand_rows("cuda", IN, OUT, torch.float16) == 1  # rather than the chunked product
    monkeypatch.setattr(widths, "tiles_readable", lambda device_type, in_features: False)
    assert widths.expand_rows("cuda", IN, OUT, torch.bfloat16) == UNLIMITED


def test_prepacking_is_not_measured_where_onednn_has_no_kernel_for_it(monkeypatch, unmeasured):
    assert widths.prepack_pays(torch.float32) is False
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert widths.prepack_pays(torch.bfloat16) is False


def test_a_dtype_the_fused_kernel_takes_not_is_chunked_at_every_width_after_one_race(monkeypatch):
    raced = []

    def stand_in(first, second, device) -> bool:
        raced.append(first().dtype)
        return True  # the chunked product in the dtype itself wins

    monkeypatch.setattr(timing, "faster", stand_in)
    monkeypatch.setattr(widths, "FUSED_DTYPES", {"cpu": (torch.float32,)})
    assert widths.measure_widths("cpu", torch.bfloat16) == [0, "bfloat16"]
    assert raced == [torch.bfloat16]  # the product's dtype alone: no sweep of a kernel that cannot run


def test_a_prepacked_product_this_onednn_cannot_multiply_does_not_pay(monkeypatch):
    class Refused(torch.nn.Module):
        def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
            super().__init__()

        def forward(self, x: Tensor) -> Tensor:
            raise RuntimeError("could not create a primitive descriptor")  # as oneDNN refuses

    monkeypatch.setattr(widths, "PrepackedLinear", Refused)

    def runs_both(first, second, device) -> bool:  # a timer stand-in: both run, neither wins
        first(), second()
        return False

    monkeypatch.setattr(timing, "faster", runs_both)
    monkeypatch.setattr(widths, "PREPACK_SHAPE", widths.LinearShape(64, 32))
    assert widths.measure_prepack_pays(torch.bfloat16) is False


def test_every_process_probes_the_same_random_weight_and_inputs():
    shape = widths.LinearShape(IN, OUT)
    first, second = (widths.random_int4(widths.CPU, torch.bfloat16, shape, GROUP, rows=4) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert first[1].shape == (IN // GROUP, OUT, 2) and first[2].shape == (4, IN)


def test_a_dense_copy_is_prepacked_where_prepacking_pays_and_a_plain_linear_elsewhere(monkeypatch):
    weight = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(0)).bfloat16()
    monkeypatch.setattr(widths, "PrepackedLinear", lambda weight, bias: ("prepacked", weight, bias))
    monkeypatch.setattr(widths, "prepack_pays", lambda dtype: True)
    name, packed, bias = widths.dense_copy_linear(weight)
    assert name == "prepacked" and packed is weight and bias is None
    monkeypatch.setattr(widths, "prepack_pays", lambda dtype: False)
    copy = widths.dense_copy_linear(weight)
    assert isinstance(copy, torch.nn.Linear) and copy.weight.data_ptr() == weight.data_ptr() and copy.bias is None
