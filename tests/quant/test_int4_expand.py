"""int4_expand: the Triton kernel that expands a packed int4 weight into a dense one, run on the CPU
by Triton's interpreter and compared bitwise with a dequantization of the test's own: the weight's
values 0..15 drawn as plain integers, packed into bytes by the layout int4_expand documents (written
out below, sharing no code with int4_layout or int4_pack), and w = (q - 8) * scale + zero computed
from those integers. The layouts are CUDA's tiles of 8 x 16 t weights (t = 2, 4, 8: 8 x 128 for
every 70B shape) in a scrambled order (no GPU has yet told their real order), one-row tiles for
output counts no 8-row tile divides, and the CPU converter's own bytes.

Triton 3.9 reads TRITON_INTERPRET when `triton.jit` decorates a kernel; int4_expand decorates its
kernel lazily, once per mode, so setting the variable for this module's tests (the fixture below)
is enough whatever ran before in the process, and leaves other modules' processes as they were."""

import subprocess
import sys
from collections.abc import Iterator
from functools import cache

import pytest
import torch
from helpers.allocations import record_allocations
from helpers.int4_layouts import cuda_layout, generator, pack_by_spec, pack_for_cuda, scrambled_layout

from specchat.errors import SpecchatError
from specchat.quant import int4_expand, timing, widths
from specchat.quant.int4_expand import expand_int4, expand_int4_reference, expanded_linear
from specchat.quant.int4_layout import TileLayout, layout_for
from specchat.quant.int4_pack import CUDA_INNER_K_TILES, GROUP_SIZES, inner_k_tiles, pack
from specchat.quant.int4_weight import Int4Weight
from specchat.triton_support import triton_available

pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")

CPU = torch.device("cpu")
# (I, group size) at which CUDA packs tiles of 8 x 16 t with t = inner_k_tiles(I): 8 x 32 at 96
# inputs, 8 x 64 at 192, 8 x 128 at 384 and 768; every group size, I three times a tile's or a
# group's width (an odd count of tile columns or of groups)
CUDA_SHAPES = [(96, 32), (192, 32), (384, 32), (192, 64), (384, 64), (384, 128), (768, 256)]
CUDA_OUTPUTS = (8, 24, 40)  # whole 8-row tiles, no multiple of the kernel's 16-row blocks
# (O, I, group size) in one-row tiles: output counts no 8-row tile divides
ODD_SHAPES = [(1, 96, 32), (15, 192, 64), (17, 384, 128), (33, 768, 256), (100, 96, 32)]
# (scales' dtype, weights' dtype): an Int4Linear's scales are in its compute dtype; float32 scales
# into bfloat16 weights round the float32 weight once more
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
          (torch.float32, torch.bfloat16)]
DTYPE_IDS = ["float32", "bfloat16", "float16", "float32-into-bfloat16"]
# the CPU converter's tiles are up to 64 rows tall (AVX512); I need only be a multiple of the group
CPU_SHAPES = {32: (64, 96), 64: (128, 384), 128: (64, 384), 256: (64, 256)}


@pytest.fixture(autouse=True, scope="module")
def interpreter() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        yield


@cache
def fma_rounds_once() -> bool:
    """Whether this Triton's interpreter rounds tl.fma once, as a GPU does: Triton 3.9's does, 3.6's
    (what torch 2.11's CUDA wheels bring) multiplies and adds in float32, rounding twice. Asked of a
    kernel of the test's own, so that the expansion kernel does not vouch for itself:
    fma(7, 1 + 2^-23, -7) is 7 * 2^-23 rounded once, and 2^-20 rounded twice."""
    import triton
    import triton.language as tl

    @triton.jit
    def fma(x_ptr, y_ptr, z_ptr, out_ptr):
        tl.store(out_ptr, tl.fma(tl.load(x_ptr), tl.load(y_ptr), tl.load(z_ptr)))

    x, y, z = (torch.tensor([value]) for value in (7.0, 1 + 2.0 ** -23, -7.0))
    out = torch.empty(1)
    fma[(1,)](x, y, z, out)
    return out.item() == 7 * 2.0 ** -23


def random_q(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """A weight's values 0..15, long [O, I]."""
    return torch.randint(0, 16, (out_features, in_features), generator=generator(seed))


def random_scales_and_zeros(groups: int, out_features: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[G, O, 2] of full float32 precision (rounded to `dtype`), so that (q - 8) * scale is seldom
    exact in float32 and a second rounding would show: scales in [2^-10, 2^-6], zeros of either sign
    in [2^-8, 2^-6], so that (q - 8) * scale + zero spans fewer than 32 bits (2^-2 down to 2^-33)
    and float64 holds it exactly."""
    scales = 2.0 ** -10 + torch.rand(groups, out_features, generator=generator(seed)) * (2.0 ** -6 - 2.0 ** -10)
    sizes = 2.0 ** -8 + torch.rand(groups, out_features, generator=generator(seed + 1)) * (2.0 ** -6 - 2.0 ** -8)
    signs = torch.randint(0, 2, (groups, out_features), generator=generator(seed + 2)) * 2 - 1
    return torch.stack([scales, sizes * signs], dim=-1).to(dtype)


def canonical_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [O, I] -> uint8 [O, I/2] in int4_pack's canonical order: q[o, i] in byte i // 2 of row o,
    even i in the high nibble."""
    return ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8)


def dequantize_by_spec(q: torch.Tensor, scales_and_zeros: torch.Tensor, dtype: torch.dtype,
                       rounds_once: bool) -> torch.Tensor:
    """w[o, i] = (q[o, i] - 8) * scale[g, o] + zero[g, o] with g = i // group size, rounded to float32
    once (exact in float64 first: random_scales_and_zeros), as a fused multiply-add rounds, or, where
    `rounds_once` is False, twice: the product, then the sum, in float32, as Triton 3.6's interpreter
    computes tl.fma (x * y + z on float32 arrays); then to `dtype`, to nearest even. Both bitwise:
    no tolerance."""
    group_size = q.shape[1] // scales_and_zeros.shape[0]
    scales, zeros = (part.repeat_interleave(group_size, 0).t() for part in scales_and_zeros.unbind(-1))
    if rounds_once:
        weights = ((q - 8).double() * scales.double() + zeros.double()).float()
    else:
        weights = (q - 8).float() * scales.float() + zeros.float()
    return weights.to(dtype)


def expand_between_sentinels(packed: torch.Tensor, scales_and_zeros: torch.Tensor, layout: TileLayout,
                             dtype: torch.dtype) -> torch.Tensor:
    """The kernel's [O, I] weights, written into the first O rows of a NaN-filled buffer a block of
    BLOCK_O rows taller: the rows past O, which the last block covers where O is no multiple of
    BLOCK_O, must stay NaN."""
    groups, out_features = scales_and_zeros.shape[:2]
    in_features = packed.numel() * packed.element_size() * 2 // out_features
    buffer = torch.full((out_features + int4_expand.BLOCK_O, in_features), float("nan"), dtype=dtype)
    expanded = expand_int4(packed, scales_and_zeros, in_features // groups, layout, dtype, out=buffer[:out_features])
    assert buffer[out_features:].isnan().all(), "the kernel wrote past its last output row"
    return expanded


def test_the_fma_probe_tells_one_rounding_from_two():
    """Triton 3.9's interpreter rounds once; the reference rounds as told, at the probe's case."""
    import triton

    if tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 9):
        assert fma_rounds_once()
    q = torch.full((1, 32), 15)  # q - 8 = 7
    pair = torch.tensor([1 + 2.0 ** -23, -7.0]).view(1, 1, 2)
    assert (dequantize_by_spec(q, pair, torch.float32, rounds_once=True) == 7 * 2.0 ** -23).all()
    assert (dequantize_by_spec(q, pair, torch.float32, rounds_once=False) == 2.0 ** -20).all()


def test_the_shapes_cover_every_cuda_layout_every_group_and_a_tail_of_every_block():
    assert {16 * inner_k_tiles(in_features, "cuda") for in_features, _ in CUDA_SHAPES} \
        == {16 * tiles for tiles in CUDA_INNER_K_TILES}
    assert {group for _, group in CUDA_SHAPES} == {group for *_, group in ODD_SHAPES} == set(GROUP_SIZES)
    assert all(count % int4_expand.BLOCK_O for count in CUDA_OUTPUTS + tuple(shape[0] for shape in ODD_SHAPES))


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_the_spec_packs_the_cpu_converters_own_bytes(group_size):
    """The packing written out above is the layout torch's CPU converter makes, as int4_layout read it."""
    out_features, in_features = CPU_SHAPES[group_size]
    layout = layout_for(CPU, in_features)
    q = random_q(out_features, in_features, seed=group_size)
    assert torch.equal(pack_by_spec(q, layout), pack(canonical_nibbles(q), CPU).reshape(-1))


def test_the_spec_dequantizes_as_int4_weight_and_the_torch_reference_do():
    """Int4Weight.dequantize() (the weights the kernel is to reproduce) and expand_int4_reference
    (the benchmark's check) are the dequantization above, rounded once."""
    out_features, in_features, group_size = 40, 384, 64
    q = random_q(out_features, in_features, seed=5)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, torch.float32, seed=5)
    expected = dequantize_by_spec(q, scales_and_zeros, torch.float32, rounds_once=True)
    weight = Int4Weight(canonical_nibbles(q), *scales_and_zeros.unbind(-1), perm=None)
    assert torch.equal(weight.dequantize(), expected)
    layout = cuda_layout(in_features, seed=5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        reference = expand_int4_reference(pack_by_spec(q, layout), scales_and_zeros, group_size, layout, dtype)
        assert torch.equal(reference, expected.to(dtype))


@pytest.mark.parametrize("scale_dtype, dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("out_features", CUDA_OUTPUTS)
@pytest.mark.parametrize("in_features, group_size", CUDA_SHAPES)
def test_cuda_layouts_expand_bitwise(in_features, group_size, out_features, scale_dtype, dtype):
    layout = cuda_layout(in_features, seed=in_features)
    q = random_q(out_features, in_features, seed=out_features + group_size)
    packed = pack_for_cuda(q, layout)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, scale_dtype, seed=group_size)
    expanded = expand_between_sentinels(packed, scales_and_zeros, layout, dtype)
    assert torch.equal(expanded, dequantize_by_spec(q, scales_and_zeros, dtype, fma_rounds_once()))


@pytest.mark.parametrize("scale_dtype, dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("out_features, in_features, group_size", ODD_SHAPES)
def test_odd_output_counts_expand_bitwise(out_features, in_features, group_size, scale_dtype, dtype):
    layout = scrambled_layout(1, 32, seed=out_features)
    q = random_q(out_features, in_features, seed=out_features)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, scale_dtype, seed=3)
    expanded = expand_between_sentinels(pack_by_spec(q, layout), scales_and_zeros, layout, dtype)
    assert torch.equal(expanded, dequantize_by_spec(q, scales_and_zeros, dtype, fma_rounds_once()))


def test_the_kernel_runs_here_under_the_interpreter():
    assert triton_available()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_the_cpu_converters_layout_expands_bitwise(group_size, dtype):
    out_features, in_features = CPU_SHAPES[group_size]
    layout = layout_for(CPU, in_features)
    assert out_features % layout.rows == 0
    q = random_q(out_features, in_features, seed=group_size)
    packed = pack(canonical_nibbles(q), CPU)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, dtype, seed=7)
    expanded = expand_int4(packed, scales_and_zeros, group_size, layout, dtype)
    assert expanded.shape == (out_features, in_features) and expanded.dtype == dtype
    assert torch.equal(expanded, dequantize_by_spec(q, scales_and_zeros, dtype, fma_rounds_once()))


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
    packed = pack(canonical_nibbles(random_q(256, 32, seed=4)), CPU)
    expanded = expand_int4(packed, scales_and_zeros, 32, layout_for(CPU, 32), torch.bfloat16)
    assert torch.equal(expanded, zeros.view(-1, 1).expand(-1, 32).to(torch.bfloat16))
    assert expanded[:4, 0].tolist() == [1.0, 1 + 2 * ulp, -1.0, -(1 + 2 * ulp)]
    assert expanded[7, 0] == -float("inf")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_expanded_linear_is_the_dense_product_of_the_expanded_weight(dtype, monkeypatch):
    """One chunk, then chunks of 24 rows (no multiple of the kernel's blocks, as CUDA's 4680 rows at
    14336 inputs; the last one 8): each chunk's columns are the product with those rows of the
    weight."""
    out_features, in_features, group_size = 80, 192, 32
    layout = cuda_layout(in_features, seed=1)
    q = random_q(out_features, in_features, seed=1)
    packed = pack_for_cuda(q, layout)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, dtype, seed=1)
    x = torch.randn(5, in_features, generator=generator(1)).to(dtype)
    reference = dequantize_by_spec(q, scales_and_zeros, dtype, fma_rounds_once())
    whole = expanded_linear(x, packed, scales_and_zeros, group_size, layout)
    assert whole.dtype == dtype and torch.equal(whole, x @ reference.t())  # torch.equal takes two dtypes alike
    monkeypatch.setattr(int4_expand, "EXPAND_WEIGHTS", 24 * in_features)
    chunked = expanded_linear(x, packed, scales_and_zeros, group_size, layout)
    for start in range(0, out_features, 24):
        assert torch.equal(chunked[:, start:start + 24], x @ reference[start:start + 24].t())


@pytest.mark.parametrize("chunk_rows", [None, 64])
def test_expanded_linear_allocates_its_workspace_and_nothing_more(chunk_rows, monkeypatch):
    """What the plan counts for a wide product through the expansion (int4.workspace_bytes takes it
    from expanded_workspace) is what a call allocates besides its output: a chunk of the weight and
    the chunk's product, whole (80 rows) or in 64-row chunks, the last one short."""
    out_features, in_features, group_size, rows = 80, 192, 32, 5
    if chunk_rows is not None:
        monkeypatch.setattr(int4_expand, "EXPAND_WEIGHTS", chunk_rows * in_features)
    layout = cuda_layout(in_features, seed=2)
    packed = pack_for_cuda(random_q(out_features, in_features, seed=2), layout)
    scales_and_zeros = random_scales_and_zeros(in_features // group_size, out_features, torch.bfloat16, seed=2)
    x = torch.randn(rows, in_features, generator=generator(2)).to(torch.bfloat16)
    sizes = record_allocations(monkeypatch)
    out = expanded_linear(x, packed, scales_and_zeros, group_size, layout)
    allocated = sum(sizes) - out.nbytes
    assert allocated == int4_expand.expanded_workspace(in_features, out_features, rows, torch.bfloat16)
    step = chunk_rows or out_features
    assert allocated == (step * in_features + rows * step) * 2  # bfloat16's 2 bytes, worked out here


def test_mismatched_arguments_are_refused():
    layout = scrambled_layout(8, 32, seed=0)
    packed = pack_by_spec(random_q(48, 96, seed=0), layout)
    scales_and_zeros = random_scales_and_zeros(3, 48, torch.float32, seed=0)
    with pytest.raises(SpecchatError, match="out must be"):
        expand_int4(packed, scales_and_zeros, 32, layout, torch.float32, out=torch.empty(48, 96, dtype=torch.bfloat16))
    with pytest.raises(SpecchatError, match="not a contiguous 48 x 96"):
        expand_int4(packed[:-16], scales_and_zeros, 32, layout, torch.float32)
    with pytest.raises(SpecchatError, match="no grid"):
        expand_int4(packed, scales_and_zeros, 32, scrambled_layout(32, 32, seed=0), torch.float32)
    # each of the pairs' faults alone: a third column, a transposed view, a missing axis
    for faulty in (torch.zeros(3, 48, 3), scales_and_zeros.transpose(0, 1), scales_and_zeros[0]):
        with pytest.raises(SpecchatError, match="scales_and_zeros must be a contiguous"):
            expand_int4(packed, faulty, 32, layout, torch.float32)
    with pytest.raises(SpecchatError, match="expand into .* not torch.int8"):
        expand_int4(packed, scales_and_zeros, 32, layout, torch.int8)


def test_importing_the_module_leaves_triton_unimported():
    code = "import sys, specchat.quant.int4_expand; assert 'triton' not in sys.modules, 'triton was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_expansion_takes_over_from_the_first_width_the_timer_says_it_wins(monkeypatch, tmp_path):
    """The CUDA choice with the CPU standing in for the device (the interpreter runs the kernel): a
    timer stand-in that runs both products at the model's shape, checks that they agree, and lets
    the expansion win from 256 rows; then one that never lets it win."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    timed = []

    def stand_in(first, second, device) -> bool:
        expanded, fused = first(), second()
        timed.append(expanded.shape[0])
        assert torch.allclose(expanded.float(), fused.float(), rtol=0.02, atol=0.02)
        return expanded.shape[0] >= 256

    monkeypatch.setattr(timing, "faster", stand_in)
    widths.expand_rows.cache_clear()
    try:
        assert widths.expand_rows("cpu", 256, 128, torch.bfloat16) == 256
        assert timed == [16, 64, 256]
        # fewer inputs than the probe's groups of 128 (a small MoE's expert): one group of them
        assert widths.expand_rows("cpu", 64, 128, torch.bfloat16) == 256
        # a dtype the fused kernel does not take (CUDA's takes bfloat16 alone): expanded at every width, untimed
        timed.clear()
        monkeypatch.setitem(widths.FUSED_DTYPES, "cpu", (torch.bfloat16,))
        assert widths.expand_rows("cpu", 256, 128, torch.float32) == 1 and timed == []
        monkeypatch.setattr(timing, "faster", lambda first, second, device: False)
        assert widths.expand_rows("cpu", 384, 128, torch.bfloat16) == float("inf")
    finally:
        widths.expand_rows.cache_clear()


def test_a_cuda_linear_expands_from_the_measured_width_unless_pinned_to_the_fused_kernel(monkeypatch):
    from specchat.quant.int4 import Int4Linear, use_fused_only

    measured = []
    monkeypatch.setattr(widths, "expand_rows", lambda *shape: measured.append(shape) or 256)
    linear = Int4Linear(256, 128, 32, False, False, torch.bfloat16, torch.device("cuda"))  # its buffers on the CPU
    assert [widths.expands(linear, rows) for rows in (1, 255, 256, 2048)] == [False, False, True, True]
    assert measured[0] == ("cuda", 256, 128, torch.bfloat16)  # the linear's own shape, not a probe's
    use_fused_only(linear)
    assert not widths.expands(linear, 2048)
    cpu_linear = Int4Linear(256, 128, 32, False, False, torch.bfloat16, CPU)
    assert not widths.expands(cpu_linear, 2048)  # CPUs keep dense copies


@pytest.mark.parametrize("arch", [90, 89])
def test_the_kernel_compiles_for_a_gpu_without_one(arch, monkeypatch):
    """Triton lowers the expansion to machine code for the GPU here (its wheel brings ptxas), so
    that a construct a GPU's compiler refuses is caught on the CPU, not on the next device lent."""
    monkeypatch.delenv("TRITON_INTERPRET")  # decorated for a GPU, not for the interpreter
    import triton
    from triton.backends.compiler import GPUTarget

    signature = {"packed_ptr": "*u8", "natural_ptr": "*i64", "scales_and_zeros_ptr": "*bf16", "out_ptr": "*bf16",
                 "out_features": "i32", "in_features": "i32", "group_size": "i32"}
    constants = {"TILE_ROWS": 8, "TILE_COLS": 128, "BLOCK_ROWS": int4_expand.BLOCK_O, "BLOCK_COLS": int4_expand.BLOCK_I,
                 "ROUND_BF16": True}
    source = triton.compiler.ASTSource(fn=int4_expand._kernel(False), signature=signature | dict.fromkeys(constants,
                                       "constexpr"), constexprs=constants)
    options = {"enable_fp_fusion": False, "num_warps": int4_expand.WARPS}  # as the launch asks
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    assert compiled.asm["cubin"]
