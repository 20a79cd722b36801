"""int4_expand: the Triton kernel that expands a packed int4 weight into a dense one, run on the CPU
by Triton's interpreter and compared bitwise with the torch reference, on the CPU converter's real
layout and on made-up layouts shaped like CUDA's (tiles of 8 x 16 t, in a scrambled order).

Triton 3.9 reads TRITON_INTERPRET when `triton.jit` decorates a kernel; int4_expand decorates its
kernel lazily, once per mode, so setting the variable for this module's tests (the fixture below)
is enough whatever ran before in the process, and leaves other modules' processes as they were."""

import subprocess
import sys
from collections.abc import Iterator
from functools import cache

import pytest
import torch

from specchat.errors import SpecchatError
from specchat.quant import int4_expand, timing
from specchat.quant.int4_expand import expand_int4, expand_int4_reference, expanded_linear, triton_available
from specchat.quant.int4_layout import TileLayout, layout_for
from specchat.quant.int4_pack import GROUP_SIZES, pack, pack_nibbles, unpack_nibbles
from specchat.quant.int4_weight import Int4Weight

pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")

CPU = torch.device("cpu")
# (group size, O, I) for made-up 8-row layouts: O a multiple of 16, not of the kernel's 32-row
# blocks; I a multiple of the group size and of 64 (the widest made-up tile)
SHAPES = {32: (48, 192), 64: (80, 384), 128: (48, 384), 256: (80, 512)}
# the CPU converter's tiles are up to 64 rows tall (AVX512); I need only be a multiple of the group
CPU_SHAPES = {32: (64, 96), 64: (128, 384), 128: (64, 384), 256: (64, 256)}


@pytest.fixture(autouse=True, scope="module")
def interpreter() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        yield


@cache
def fma_rounds_once() -> bool:
    """Whether this Triton's interpreter rounds the kernel's fused multiply-add once, as a GPU does:
    Triton 3.9's does, 3.6's (what torch 2.11's CUDA wheels bring) multiplies and adds in float32,
    rounding twice. 7 * (1 + 2^-23) - 7 is 7 * 2^-23 rounded once, and 2^-20 rounded twice."""
    layout = layout_for(CPU, 32)
    nibbles = torch.full((layout.rows, 16), 0xFF, dtype=torch.uint8)  # q = 15: q - 8 = 7
    pair = torch.tensor([1 + 2.0 ** -23, -7.0]).expand(1, layout.rows, 2).contiguous()
    weights = expand_int4(pack(nibbles, CPU), pair, 32, layout, torch.float32)
    return bool((weights == 7 * 2.0 ** -23).all())


def needs_one_rounding(dtype: torch.dtype) -> None:
    """Float32 weights are the fused multiply-add's own result: bitwise only where it rounds once."""
    if dtype == torch.float32 and not fma_rounds_once():
        import triton

        pytest.skip(f"Triton {triton.__version__}'s interpreter rounds tl.fma twice (a GPU, and Triton 3.9's "
                    "interpreter, once): float32 weights cannot be bitwise here")


def test_the_fma_probe_tells_one_rounding_from_two():
    """Where the interpreter rounds once, the probe says so; whatever it says, the bfloat16 weights
    (rounded once more) are the reference's at the probe's case."""
    layout = layout_for(CPU, 32)
    nibbles = torch.full((layout.rows, 16), 0xFF, dtype=torch.uint8)
    pair = torch.tensor([1 + 2.0 ** -23, -7.0]).expand(1, layout.rows, 2).contiguous()
    reference = expand_int4_reference(pack(nibbles, CPU), pair, 32, layout, torch.float32)
    assert (reference == 7 * 2.0 ** -23).all()  # the reference rounds once
    import triton

    if tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 9):
        assert fma_rounds_once()


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_nibbles(rows: int, cols: int, seed: int) -> torch.Tensor:
    return pack_nibbles(torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=generator(seed)))


def random_scales_and_zeros(groups: int, rows: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[G, O, 2] of full float32 precision (rounded to `dtype`): (q - 8) * scale is then seldom exact
    in float32, so a kernel rounding twice (no fused multiply-add) would show."""
    scales = torch.rand(groups, rows, generator=generator(seed)) * 0.02 + 1e-3
    zeros = torch.randn(groups, rows, generator=generator(seed + 1)) * 0.01
    return torch.stack([scales, zeros], dim=-1).to(dtype)


def made_up_layout(rows: int, cols: int, seed: int) -> TileLayout:
    """Tiles like CUDA's (8 x 16 t) with their weights in a seeded random order."""
    natural = torch.randperm(rows * cols, generator=generator(seed))
    return TileLayout(rows, cols, natural, in_order=False)


def pack_into(nibbles: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """Canonical nibbles [O, I/2] -> bytes laid out in `layout`'s tiles, as uint8 [O I / 2]: weight
    r * cols + c of each tile at plane position natural[r * cols + c]."""
    q = unpack_nibbles(nibbles)
    out_features, in_features = q.shape
    tiles = q.view(out_features // layout.rows, layout.rows, in_features // layout.cols, layout.cols)
    tiles = tiles.permute(0, 2, 1, 3).reshape(-1, layout.rows * layout.cols)  # row-major tile order
    planes = torch.empty_like(tiles)
    planes[:, layout.natural] = tiles
    half = planes.shape[1] // 2
    return (planes[:, :half] | (planes[:, half:] << 4)).reshape(-1)


def as_cuda_int32(packed: torch.Tensor, out_features: int, in_features: int, cols: int) -> torch.Tensor:
    """The bytes in CUDA's packed shape, int32 [O/8, I/16t, 32, t/2] for tiles of 8 x 16 t."""
    return packed.view(torch.int32).view(out_features // 8, in_features // cols, 32, cols // 32)


def test_the_packing_helper_writes_the_cpu_converters_own_bytes():
    layout = layout_for(CPU, 96)
    nibbles = random_nibbles(2 * layout.rows, 96, seed=3)
    assert torch.equal(pack_into(nibbles, layout), pack(nibbles, CPU).reshape(-1))


def test_the_kernel_runs_here_under_the_interpreter():
    assert triton_available()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_the_cpu_converters_layout_expands_bitwise(group_size, dtype):
    needs_one_rounding(dtype)
    out_features, in_features = CPU_SHAPES[group_size]
    layout = layout_for(CPU, in_features)
    assert out_features % layout.rows == 0
    packed = pack(random_nibbles(out_features, in_features, seed=group_size), CPU)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, dtype, seed=7)
    expanded = expand_int4(packed, scales_and_zeros, group_size, layout, dtype)
    assert expanded.shape == (out_features, in_features) and expanded.dtype == dtype
    assert torch.equal(expanded, expand_int4_reference(packed, scales_and_zeros, group_size, layout, dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("tile_cols", [32, 64])
def test_cuda_shaped_layouts_expand_bitwise(tile_cols, group_size, dtype):
    needs_one_rounding(dtype)
    out_features, in_features = SHAPES[group_size]
    layout = made_up_layout(8, tile_cols, seed=tile_cols)
    nibbles = random_nibbles(out_features, in_features, seed=group_size + 1)
    packed = as_cuda_int32(pack_into(nibbles, layout), out_features, in_features, tile_cols)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, dtype, seed=11)
    expanded = expand_int4(packed, scales_and_zeros, group_size, layout, dtype)
    assert torch.equal(expanded, expand_int4_reference(packed, scales_and_zeros, group_size, layout, dtype))
    # scale 1 and zero 0: the nibbles themselves, less 8, read without int4_layout
    unit = torch.stack([torch.ones_like(scales_and_zeros[..., 0]), torch.zeros_like(scales_and_zeros[..., 1])], -1)
    q = unpack_nibbles(nibbles).to(dtype) - 8
    assert torch.equal(expand_int4(packed, unit, group_size, layout, dtype), q)


def test_half_precision_expands_bitwise():
    layout = made_up_layout(8, 32, seed=5)
    packed = pack_into(random_nibbles(48, 96, seed=5), layout)
    scales_and_zeros = random_scales_and_zeros(3, 48, torch.float16, seed=5)
    expanded = expand_int4(packed, scales_and_zeros, 32, layout, torch.float16)
    assert torch.equal(expanded, expand_int4_reference(packed, scales_and_zeros, 32, layout, torch.float16))


def test_bfloat16_rounds_to_nearest_even():
    """Triton's interpreter truncates a float32 -> bfloat16 cast (the GPU rounds it): the kernel
    rounds on the bits, ties to even, and overflows to infinity as torch does."""
    ulp = 2.0 ** -7  # of bfloat16 at 1
    ties = [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), -(1 + 3 * ulp / 2)]
    edges = [1 + ulp / 2 + 2.0 ** -20, 1 + ulp / 2 - 2.0 ** -20, 3.3961e38, -3.4028e38, 0.0]
    count = 256 - len(ties) - len(edges)
    wide = torch.randn(count, generator=generator(2)) * 10.0 ** torch.randint(-30, 30, (count,), generator=generator(3))
    zeros = torch.cat([torch.tensor(ties + edges), wide]).view(1, 256)
    # one group of 32 inputs, 256 outputs: scale 0, so each weight is its output's zero, exactly
    scales_and_zeros = torch.stack([torch.zeros_like(zeros), zeros], dim=-1)
    packed = pack(random_nibbles(256, 32, seed=4), CPU)
    expanded = expand_int4(packed, scales_and_zeros, 32, layout_for(CPU, 32), torch.bfloat16)
    assert torch.equal(expanded, zeros.view(-1, 1).expand(-1, 32).to(torch.bfloat16))
    assert expanded[:4, 0].tolist() == [1.0, 1 + 2 * ulp, -1.0, -(1 + 2 * ulp)]
    assert expanded[7, 0] == -float("inf")


@pytest.mark.parametrize("layout_name", ["cpu", "cuda-like"])
def test_expanded_weights_are_the_int4_weights_own(layout_name):
    needs_one_rounding(torch.float32)
    out_features, in_features, group_size = 64, 384, 64
    layout = layout_for(CPU, in_features) if layout_name == "cpu" else made_up_layout(8, 64, seed=9)
    scales, zeros = random_scales_and_zeros(in_features // group_size, out_features, torch.float32, seed=9).unbind(-1)
    weight = Int4Weight(random_nibbles(out_features, in_features, seed=9), scales, zeros, perm=None)
    packed = pack(weight.nibbles, CPU) if layout_name == "cpu" else pack_into(weight.nibbles, layout)
    scales_and_zeros = torch.stack([weight.scales, weight.zeros], dim=-1)
    dequantized = weight.dequantize()
    assert torch.equal(expand_int4(packed, scales_and_zeros, group_size, layout, torch.float32), dequantized)
    # float32 scales, bfloat16 weights: the float32 weight rounded once more
    assert torch.equal(expand_int4(packed, scales_and_zeros, group_size, layout, torch.bfloat16),
                       dequantized.to(torch.bfloat16))
    # bfloat16 scales (an Int4Linear's buffer in bf16): the weight of the rounded scales, rounded
    rounded = scales_and_zeros.to(torch.bfloat16)
    rounded_weight = Int4Weight(weight.nibbles, rounded[..., 0].float(), rounded[..., 1].float(), None)
    assert torch.equal(expand_int4(packed, rounded, group_size, layout, torch.bfloat16),
                       rounded_weight.dequantize().to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_expanded_linear_is_the_dense_product_of_the_expanded_weight(dtype, monkeypatch):
    """One chunk, then chunks of 16 rows (the last one short): each chunk's columns are the product
    with those rows of the expanded weight."""
    needs_one_rounding(dtype)
    out_features, in_features, group_size = 80, 192, 32
    layout = made_up_layout(8, 64, seed=1)
    packed = pack_into(random_nibbles(out_features, in_features, seed=1), layout)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, dtype, seed=1)
    x = torch.randn(5, in_features, generator=generator(1)).to(dtype)
    reference = expand_int4_reference(packed, scales_and_zeros, group_size, layout, dtype)
    assert torch.equal(expanded_linear(x, packed, scales_and_zeros, group_size, layout), x @ reference.t())
    monkeypatch.setattr(int4_expand, "EXPAND_WEIGHTS", 16 * in_features + 1)
    chunked = expanded_linear(x, packed, scales_and_zeros, group_size, layout)
    for start in range(0, out_features, 16):
        assert torch.equal(chunked[:, start:start + 16], x @ reference[start:start + 16].t())


def test_mismatched_arguments_are_refused():
    layout = made_up_layout(8, 32, seed=0)
    packed = pack_into(random_nibbles(48, 96, seed=0), layout)
    scales_and_zeros = random_scales_and_zeros(3, 48, torch.float32, seed=0)
    with pytest.raises(SpecchatError, match="out must be"):
        expand_int4(packed, scales_and_zeros, 32, layout, torch.float32, out=torch.empty(48, 96, dtype=torch.bfloat16))
    with pytest.raises(SpecchatError, match="not a contiguous 48 x 96"):
        expand_int4(packed[:-16], scales_and_zeros, 32, layout, torch.float32)
    with pytest.raises(SpecchatError, match="no grid"):
        expand_int4(packed, scales_and_zeros, 32, made_up_layout(32, 32, seed=0), torch.float32)


def test_importing_the_module_leaves_triton_unimported():
    code = "import sys, specchat.quant.int4_expand; assert 'triton' not in sys.modules, 'triton was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_expansion_takes_over_from_the_first_width_the_timer_says_it_wins(monkeypatch):
    """The CUDA choice with the CPU standing in for the device (the interpreter runs the kernel): a
    timer stand-in that runs both products at the model's shape, checks that they agree, and lets
    the expansion win from 256 rows; then one that never lets it win."""
    timed = []

    def stand_in(first, second, device) -> bool:
        expanded, fused = first(), second()
        timed.append(expanded.shape[0])
        assert torch.allclose(expanded.float(), fused.float(), rtol=0.02, atol=0.02)
        return expanded.shape[0] >= 256

    monkeypatch.setattr(timing, "faster", stand_in)
    int4_expand.expand_rows.cache_clear()
    try:
        assert int4_expand.expand_rows("cpu", 256, 128, torch.bfloat16) == 256
        assert timed == [16, 64, 256]
        # fewer inputs than the probe's groups of 128 (a small MoE's expert): one group of them
        assert int4_expand.expand_rows("cpu", 64, 128, torch.bfloat16) == 256
        # a dtype the fused kernel does not take (CUDA's takes bfloat16 alone): expanded at every width, untimed
        timed.clear()
        monkeypatch.setitem(int4_expand.FUSED_DTYPES, "cpu", (torch.bfloat16,))
        assert int4_expand.expand_rows("cpu", 256, 128, torch.float32) == 1 and timed == []
        monkeypatch.setattr(timing, "faster", lambda first, second, device: False)
        assert int4_expand.expand_rows("cpu", 384, 128, torch.bfloat16) == float("inf")
    finally:
        int4_expand.expand_rows.cache_clear()


def test_a_cuda_linear_expands_from_the_measured_width_unless_pinned_to_the_fused_kernel(monkeypatch):
    from specchat.quant import int4
    from specchat.quant.int4 import Int4Linear, use_fused_only

    measured = []
    monkeypatch.setattr(int4, "expand_rows", lambda *shape: measured.append(shape) or 256)
    linear = Int4Linear(256, 128, 32, False, False, torch.bfloat16, torch.device("cuda"))  # its buffers on the CPU
    assert [linear.expands(rows) for rows in (1, 255, 256, 2048)] == [False, False, True, True]
    assert measured[0] == ("cuda", 256, 128, torch.bfloat16)  # the linear's own shape, not a probe's
    use_fused_only(linear)
    assert not linear.expands(2048)
    assert not Int4Linear(256, 128, 32, False, False, torch.bfloat16, CPU).expands(2048)  # CPUs keep dense copies
