"""Int4Linear: the fused kernel's and the chunked product's weights are the Int4Weight's, its
forward matches a dense reference, a row's output does not depend on the rows beside it (the CPU
kernel), and its buffers are what a skeleton declares."""

import math

import pytest
import torch
from helpers.int4_weights import GROUP, IN, OUT, random_weight

from specchat.errors import SpecchatError
from specchat.quant import timing
from specchat.quant.int4 import Int4Linear, int4_fits, int4_linear, int4_tensors, use_fused_only
from specchat.quant.int4_chunks import chunked_linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import fused_linear, pack
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.widths import FUSED_ROWS, UNLIMITED, WIDE_ROWS, WidthChoice, width_choice

CPU = torch.device("cpu")


def packed_parts(weight: Int4Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    tensors = int4_tensors(weight, None, dtype, CPU)
    return tensors["packed"], tensors["scales_and_zeros"]


def test_the_fused_cpu_kernel_multiplies_by_the_weight_itself_in_float32():
    weight = random_weight()
    packed, scales_and_zeros = packed_parts(weight, torch.float32)
    kernel_weight = fused_linear(torch.eye(IN), packed, scales_and_zeros, GROUP).t()
    assert torch.equal(kernel_weight, weight.dequantize())


def test_the_chunked_product_dequantizes_to_the_same_weight():
    weight = random_weight(out_features=640)
    packed, scales_and_zeros = packed_parts(weight, torch.float32)
    chunked = chunked_linear(torch.eye(IN), packed, scales_and_zeros, GROUP, layout_for(CPU, IN), torch.float32)
    assert torch.equal(chunked.t(), weight.dequantize())


@pytest.mark.parametrize("path", ["fused", "chunked-float32", "chunked-dtype"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_the_dense_product(path, dtype):
    weight = random_weight(act_order=True)
    bias = torch.randn(OUT)
    linear = int4_linear(weight, bias, dtype, CPU)
    linear.widths = WidthChoice(UNLIMITED if path == "fused" else 0, torch.float32 if path.endswith("32") else dtype)
    x = torch.randn(2, 5, IN)
    reference = x.double() @ weight.dequantize().double().t() + bias.double()
    out = linear(x.to(dtype))
    assert out.shape == (2, 5, OUT) and out.dtype == dtype
    # float32: summation order only; bf16: inputs, scales, zeros and output each rounded to bf16
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert (out.double() - reference).norm() <= tolerance * reference.norm()


@pytest.mark.parametrize("dtype,widths", [(torch.bfloat16, (16, 256)), (torch.float32, (16,)), (torch.float16, (16,))])
def test_the_cpu_kernel_computes_a_row_the_same_whatever_rows_are_beside_it(dtype, widths):
    """The fact the exactness of speculative decoding rests on: a row alone and inside a batch of
    16 or 256 give bitwise the same output (float32 and float16 run a scalar kernel on x86: 16 only)."""
    packed, scales_and_zeros = packed_parts(random_weight(out_features=256, in_features=512), dtype)
    x = torch.randn(max(widths), 512).to(dtype)
    for rows in widths:
        batch = fused_linear(x[:rows], packed, scales_and_zeros, GROUP)
        for row in (0, 1, 5, rows - 1):
            assert torch.equal(fused_linear(x[row:row + 1], packed, scales_and_zeros, GROUP)[0], batch[row])


def test_a_skeleton_declares_the_buffers_packing_fills():
    weight = random_weight(act_order=True)
    with torch.device("meta"):
        empty = Int4Linear(IN, OUT, GROUP, bias=True, act_order=True, dtype=torch.bfloat16, kernel=CPU)
    tensors = int4_tensors(weight, torch.zeros(OUT), torch.bfloat16, CPU)
    declared = {name: (t.shape, t.dtype) for name, t in empty.state_dict().items()}
    assert declared == {name: (t.shape, t.dtype) for name, t in tensors.items()}
    assert tensors["packed"].nbytes == OUT * IN // 2  # 4 bits a weight, as stored


def test_inputs_of_another_dtype_are_refused():
    linear = int4_linear(random_weight(), None, torch.bfloat16, CPU)
    with pytest.raises(SpecchatError, match="float32 inputs"):
        linear(torch.randn(1, IN))


@pytest.mark.parametrize("product_wins, fused_up_to, expected", [
    (True, 16, WidthChoice(16, torch.bfloat16)),
    (False, 0, WidthChoice(0, torch.float32)),
    (False, FUSED_ROWS[-1], WidthChoice(UNLIMITED, torch.float32)),
])
def test_the_width_choice_is_what_the_timer_says_measured_once_per_machine(monkeypatch, tmp_path, product_wins,
                                                                           fused_up_to, expected):
    """The choice, not the clock: a stand-in for the timer that first says whether the chunked
    product in bf16 beats float32 at WIDE_ROWS, then lets the fused kernel win up to `fused_up_to`
    rows, on a machine that has measured nothing yet; the next process there reads the choice."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    if layout_for(CPU, IN) is None:
        pytest.skip("this torch's int4 layout cannot be read back: the fused kernel serves every width unprobed")
    timed = []

    def stand_in(first, second, device) -> bool:
        timed.append(first().shape[0])  # the rows of the first product timed
        return product_wins if len(timed) == 1 else timed[-1] <= fused_up_to

    monkeypatch.setattr(timing, "faster", stand_in)
    width_choice.cache_clear()
    try:
        choice = width_choice("cpu", torch.bfloat16)
        assert choice == expected
        losses = [rows for rows in FUSED_ROWS if rows > fused_up_to][:1]  # the sweep stops at the first
        assert timed == [WIDE_ROWS, *(rows for rows in FUSED_ROWS if rows <= fused_up_to), *losses]
        timed.clear()
        assert width_choice("cpu", torch.bfloat16) is choice and not timed  # cached in the process
        width_choice.cache_clear()  # another process on the same machine
        assert width_choice("cpu", torch.bfloat16) == choice and not timed
    finally:
        width_choice.cache_clear()


def test_fused_only_pins_every_linear():
    model = torch.nn.Sequential(int4_linear(random_weight(), None, torch.float32, CPU), torch.nn.ReLU())
    assert use_fused_only(model) == 1
    assert math.isinf(model[0].widths.fused_rows)


def test_shapes_the_kernels_cannot_take_do_not_fit():
    assert int4_fits(256, 128, 32, CPU)
    assert not int4_fits(256, 128, 16, CPU)  # groups under 32
    assert not int4_fits(100, 128, 32, CPU)
    assert not int4_fits(256, 40, 32, CPU)
    # CUDA's kernels take any multiple of 16 rows; a CPU's chunked products read whole tiles of its layout
    cuda = torch.device("cuda")
    assert int4_fits(96, 48, 32, cuda) and not int4_fits(96, 48, 32, CPU)
    assert not int4_fits(96, 40, 32, cuda) and not int4_fits(100, 48, 32, cuda)
    with pytest.raises(SpecchatError, match="cannot take"):
        int4_tensors(random_weight(out_features=48), None, torch.float32, CPU)
    # nor is such a linear made, even as a skeleton to be filled later
    with pytest.raises(SpecchatError, match="divisible by 16"):
        Int4Linear(256, 40, 32, False, False, torch.float32, CPU)


def test_packing_is_deterministic_and_device_independent_in_its_source():
    weight = random_weight()
    assert torch.equal(pack(weight.nibbles, CPU), pack(weight.nibbles.clone(), CPU))
