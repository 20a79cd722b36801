"""int4_gemm: the Triton kernel that multiplies input rows by a 4-bit weight, expanding each tile in
registers, run on the CPU by Triton's interpreter against the test's own float32 product of the
dequantized weight (rounded to the input's dtype, as the kernel rounds it); its words hold input
8r + k of output o in nibble k of [r, o], written out below with plain integers. Read from torch's
packed layout instead (the CPU converter's tiles here; CUDA's are read by the same indexing,
tested in test_int4_expand), it gives the words' product bit for bit."""

from collections.abc import Iterator

import pytest
import torch
from helpers.gemm_compile import CUDA_TILES, WORDS, compiled
from helpers.int4_layouts import cuda_layout, pack_for_cuda

from specchat.errors import SpecchatError
from specchat.quant import timing, widths
from specchat.quant.gemm_blocks import BLOCK_ROWS, Blocks, blocks_for
from specchat.quant.gptq import pack_int4_rows
from specchat.quant.int4 import Int4Linear, int4_linear, use_fused_only, use_registers
from specchat.quant.int4_gemm import gemm_words, w4a16_linear, w4a16_tiled_linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_weight import Int4Weight

pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")


@pytest.fixture(autouse=True, scope="module")
def interpreter() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        yield


def drawn(out_features: int, in_features: int, group_size: int, seed: int) -> tuple[torch.Tensor, Int4Weight]:
    """Values 0..15 [O, I] and the Int4Weight holding them (even input in the high nibble)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=generator)
    nibbles = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8)
    groups = in_features // group_size
    scales = torch.rand(groups, out_features, generator=generator) / 16
    zeros = torch.randn(groups, out_features, generator=generator) / 16
    return q, Int4Weight(nibbles, scales, zeros, None)


def pairs_of(weight: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """The weight's scales_and_zeros [G, O, 2] in `dtype`, as an Int4Linear holds them."""
    return torch.stack([weight.scales, weight.zeros], dim=-1).to(dtype)


def dequantized(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                dtype: torch.dtype) -> torch.Tensor:
    """w [O, I] = (q - 8) scale + zero in float32, scales and zeros [G, O], rounded once to `dtype`."""
    groups = torch.arange(q.shape[1]) // group_size
    return ((q.float() - 8) * scales[groups].t() + zeros[groups].t()).to(dtype)


def test_the_words_hold_eight_inputs_of_one_output_each():
    q, weight = drawn(8, 32, 32, seed=1)
    words = gemm_words(weight)
    assert words.shape == (4, 8) and words.dtype == torch.int32
    for r in range(4):
        for o in range(8):
            expected = sum(int(q[o, 8 * r + k]) << (4 * k) for k in range(8))
            assert int(words[r, o]) & 0xFFFFFFFF == expected


@pytest.mark.parametrize("rows", [1, 5, BLOCK_ROWS[0], 40, BLOCK_ROWS[-1] + 3])  # padded, whole, past the largest block
@pytest.mark.parametrize(("out_features", "in_features", "group_size"), [(64, 128, 32), (96, 256, 128), (128, 192, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("blocks", [None, Blocks(16, 32, 128, 3)])  # blocks_for's; inputs split in 3 shares
def test_the_product_is_the_dequantized_weights(rows, out_features, in_features, group_size, dtype, blocks):
    q, weight = drawn(out_features, in_features, group_size, seed=rows + out_features)
    dense = dequantized(q, weight.scales, weight.zeros, group_size, dtype)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
    product = w4a16_linear(x, gemm_words(weight), pairs_of(weight, dtype), group_size, blocks)
    reference = x.float() @ dense.float().t()
    assert product.dtype == dtype and product.shape == (rows, out_features)
    # float32 sums in another order, rounded once to dtype: at most 0.95 of dtype's eps times the largest
    # value over these cases (Triton 3.9's interpreter, the AMD EPYC, 2026-11-28); the bound is 2 of them
    assert torch.allclose(product.float(), reference, rtol=0, atol=2 * torch.finfo(dtype).eps * reference.abs().max())


@pytest.mark.parametrize(("dtype", "ones"), [(torch.bfloat16, 1), (torch.float16, 2)])
def test_each_weight_is_rounded_to_the_inputs_dtype_before_the_product(dtype, ones):
    """Rows of `ones` ones (input r, and r + 1) read back the weights, or sums of two, exactly: each
    weight rounded to nearest from float32 to the input's dtype, as a GPU rounds it before tl.dot,
    then summed in float32. (Under the interpreter a float32 -> bfloat16 store truncates, so bf16
    rows read one weight each: a value that needs no rounding of its own.)"""
    q, weight = drawn(64, 128, 32, seed=3)
    pairs = pairs_of(weight, dtype)
    dense = dequantized(q, pairs[..., 0].float(), pairs[..., 1].float(), 32, dtype)  # from the kernel's pairs
    x = sum(torch.eye(128).roll(shift, dims=1) for shift in range(ones)).to(dtype)
    product = w4a16_linear(x, gemm_words(weight), pairs, 32)
    assert torch.equal(product, (x.float() @ dense.float().t()).to(dtype))


def test_what_the_kernel_cannot_take_is_one_line():
    _, weight = drawn(64, 128, 32, seed=0)
    words = gemm_words(weight)
    pairs = pairs_of(weight, torch.bfloat16)
    with pytest.raises(SpecchatError, match="x must be a contiguous"):
        w4a16_linear(torch.ones(2, 128), words, pairs, 32)  # float32 inputs
    linear = int4_linear(weight, None, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(SpecchatError, match="x must be a contiguous"):  # read from torch's tiles too
        w4a16_tiled_linear(torch.ones(2, 128), linear.packed, linear.scales_and_zeros, 32,
                           layout_for(torch.device("cpu"), 128))
    x = torch.ones(2, 128, dtype=torch.bfloat16)
    for wrong in (words.long(), words.t().contiguous().t()):  # contiguous int64; int32 in columns
        with pytest.raises(SpecchatError, match="words must be contiguous int32"):
            w4a16_linear(x, wrong, pairs, 32)
    with pytest.raises(SpecchatError, match="scales_and_zeros must be"):
        w4a16_linear(x, words, pairs[:2], 32)
    with pytest.raises(SpecchatError, match="multiple of 16"):
        w4a16_linear(x, words, torch.zeros(16, 64, 2, dtype=torch.bfloat16), 8)


@pytest.mark.parametrize("rows", [1, 40])
def test_read_from_torchs_tiles_the_product_is_the_words_bit_for_bit(rows):
    _, weight = drawn(128, 256, 64, seed=rows)
    linear = int4_linear(weight, None, torch.bfloat16, torch.device("cpu"))
    layout = layout_for(torch.device("cpu"), 256)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    tiled = w4a16_tiled_linear(x, linear.packed, linear.scales_and_zeros, 64, layout)
    assert torch.equal(tiled, w4a16_linear(x, gemm_words(weight), linear.scales_and_zeros, 64))


def test_a_drafts_cuda_linear_runs_the_kernel_within_the_measured_span_and_a_targets_never(monkeypatch):
    spans = []
    monkeypatch.setattr(widths, "gemm_span", lambda *shape: spans.append(shape) or (16, 64))
    linear = Int4Linear(256, 128, 32, False, False, torch.bfloat16, torch.device("cuda"))  # its buffers on the CPU
    assert not any(widths.in_registers(linear, rows) for rows in (1, 16, 64))  # a target's linear
    assert use_registers(linear) == 1
    assert [widths.in_registers(linear, rows) for rows in (1, 15, 16, 64, 65, 256)] == [False, False, True, True,
                                                                                         False, False]
    assert spans[0] == ("cuda", 256, 128, torch.bfloat16)  # the linear's own shape
    cpu_linear = Int4Linear(256, 128, 32, False, False, torch.bfloat16, torch.device("cpu"))
    use_registers(cpu_linear)
    assert not widths.in_registers(cpu_linear, 16)  # a CPU runs Triton only under its interpreter
    use_fused_only(linear)
    assert not widths.in_registers(linear, 16)  # pinned to the fused kernel


def test_the_span_is_where_the_timer_says_the_kernel_wins_over_what_the_linear_runs_otherwise(monkeypatch, tmp_path):
    """The CUDA choice with the CPU standing in for the device (the interpreter runs the kernels): a
    timer stand-in that runs both products at the shape, checks that they agree (the fused kernel
    below the expansion's 64 rows, the expansion from there), and lets the kernel win at 4-64 rows."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    monkeypatch.setattr(widths, "expand_rows", lambda *shape: 64)
    expanded, expand = [], widths.expanded_linear
    monkeypatch.setattr(widths, "expanded_linear", lambda x, *rest: expanded.append(x.shape[0]) or expand(x, *rest))
    timed = []

    def stand_in(first, second, device) -> bool:
        registers, current = first(), second()
        timed.append(registers.shape[0])
        # bf16 outputs of sums in other orders: |a - b| / (1 + |b|) at most 0.0077 against the fused kernel and
        # the expansion at these shapes and widths (the interpreter, the AMD EPYC, 2026-11-28); bound 2x
        assert torch.allclose(registers.float(), current.float(), rtol=0.0154, atol=0.0154)
        return 4 <= registers.shape[0] <= 64

    monkeypatch.setattr(timing, "faster", stand_in)
    widths.gemm_span.cache_clear()
    try:
        assert widths.gemm_span("cpu", 256, 128, torch.bfloat16) == (4, 64)
        assert timed == [1, 4, 16, 64, 256]
        assert expanded == [64, 256]  # from the expansion's rows, each width's current product once
        assert widths.gemm_span("cpu", 256, 128, torch.float32) is None  # the kernel takes 16-bit inputs
        monkeypatch.setattr(timing, "faster", lambda first, second, device: False)
        assert widths.gemm_span("cpu", 384, 128, torch.bfloat16) is None
        monkeypatch.setattr(timing, "faster", stand_in)
        monkeypatch.setattr(widths, "expand_rows", lambda *shape: float("inf"))  # the expansion never wins here
        assert widths.gemm_span("cpu", 512, 128, torch.bfloat16) == (4, 64)  # against the fused kernel alone
        monkeypatch.setattr(widths, "triton_available", lambda: False)
        assert widths.gemm_span("cpu", 768, 128, torch.bfloat16) is None  # untimed: no Triton to run it
    finally:
        widths.gemm_span.cache_clear()


@pytest.mark.parametrize(("in_features", "group_size"), [(96, 32), (192, 64), (384, 128)])  # CUDA's 8 x 32/64/128 tiles
# steps of whole tiles (their positions read once, hoisted), inputs split in 2; steps of 16 inputs, within a tile
@pytest.mark.parametrize("blocks", [None, Blocks(16, 32, 128, 2), Blocks(16, 32, 16, 2)])
def test_cudas_tiles_give_the_words_product_bit_for_bit(in_features, group_size, blocks):
    """Tiles of the shape CUDA packs in, their order scrambled (the kernel reads whatever order
    int4_layout learns), packed by the test's own spec."""
    layout = cuda_layout(in_features, seed=in_features)
    q = torch.randint(0, 16, (24, in_features), generator=torch.Generator().manual_seed(group_size))
    packed = pack_for_cuda(q, layout)
    scales = torch.rand(in_features // group_size, 24, 2, generator=torch.Generator().manual_seed(1)) / 16
    pairs = scales.to(torch.bfloat16)
    x = torch.randn(5, in_features, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    tiled = w4a16_tiled_linear(x, packed, pairs, group_size, layout, blocks)
    assert torch.equal(tiled, w4a16_linear(x, pack_int4_rows(q.t()), pairs, group_size, blocks))


@pytest.mark.parametrize("arch", [90, 89])  # Hopper (H100, H200) and Ada (the RTX 4090 the paper ran on)
@pytest.mark.parametrize("tiles", [WORDS, CUDA_TILES])
# blocks_for's (CUDA's 128-input tiles read once a program); split inputs; tiles read every step
@pytest.mark.parametrize("blocks", [blocks_for(1), Blocks(64, 128, 128, 4, 8), Blocks(16, 64, 64, 1)])
def test_the_kernel_compiles_for_a_gpu_without_one(arch, tiles, blocks):
    """Triton lowers the kernel to machine code for the GPU here (its wheel brings ptxas): what the
    interpreter cannot catch, a construct a GPU's compiler refuses, is caught on the CPU (Triton
    3.6's, which torch 2.11's CUDA wheels bring, compiled it for sm_80, 89 and 90 alike)."""
    assert compiled(blocks, arch, tiles).asm["cubin"]
