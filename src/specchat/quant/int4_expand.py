"""A packed int4 weight expanded whole into a dense [O, I] matrix by one Triton kernel, for wide inputs.

Past a few dozen input rows torch's fused int4 kernels on CUDA run far slower than a dense matmul
(20-50x at a tree of 256-2048 tokens), so a wide input is better served by expanding the weight at
memory speed and running one cuBLAS matmul: x [rows, I] @ w.T with w [O, I] in nn.Linear's layout.

The kernel reads the packed bytes through a TileLayout (int4_layout), so one kernel serves every
layout torch makes: a grid of `rows` x `cols` tiles in row-major order (output-row tiles outer),
tile t in bytes t * H .. t * H + H - 1 with H = rows * cols / 2. For weight (o, i):
  t = (o // rows) * (I // cols) + i // cols,   p = natural[(o % rows) * cols + i % cols]
  q = (byte[t * H + p % H] >> 4 * (p // H)) & 0xF     (positions 0..H-1 low nibbles, H..2H-1 high)
  w[o, i] = (q - 8) * scale[g, o] + zero[g, o],   g = i // group_size
computed in float32 as one fused multiply-add (rounded once: bitwise Int4Weight.dequantize() in
float32) and rounded once more, to nearest even, into the output dtype. The rounding to bfloat16
is done on the bits, not by a cast: Triton's interpreter truncates a float32 -> bfloat16 cast where
the GPU rounds it, and the two must agree for the CPU tests to vouch for the GPU.

Triton is imported only when a kernel is launched (importing specchat does not need it), and the
kernel is decorated per interpreter mode: Triton 3.9 reads TRITON_INTERPRET when `triton.jit`
decorates a function, so one decorated in another mode would stay in that mode.
"""

import math
from functools import cache
from typing import Any

import torch
from torch import Tensor

from specchat.errors import SpecchatError
from specchat.quant.int4_layout import TileLayout, unpack_transposed

# Output rows and inputs per program (inputs: the largest common divisor of BLOCK_I and the group
# size, one group a program). Swept on an H200 at a 70B layer's shapes (scripts/bench_int4_expand.py):
# 16 x 128 in 4 warps expanded 8192 x 28672 in 0.54 ms (870 GB/s written), 32 x 128 in 0.75 ms,
# 64 x 256 in 0.89-1.07 ms.
BLOCK_O = 16
BLOCK_I = 128
WARPS = 4  # Triton's default; 2 and 8 were no faster
EXPAND_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Weights expanded per chunk of a wide product: 128 MB in bf16. On the H200 a 8192 x 28672 product
# at 1024 rows took 1.52 ms in chunks of 2^25 weights, 1.47 in 2^26, 1.44 in 2^27, 1.38 whole; 2^26
# keeps most of the gain in an eighth of a whole 70B MLP weight's 470 MB.
EXPAND_WEIGHTS = 1 << 26


@cache
def _kernel(interpret: bool) -> Any:
    """The expansion kernel, decorated under TRITON_INTERPRET as it is now; `interpret` (that
    setting) is only the cache's key, so that each mode gets a kernel decorated in it."""
    import triton
    import triton.language as tl

    @triton.jit
    def expand(packed_ptr, natural_ptr, scales_and_zeros_ptr, out_ptr, out_features, in_features, group_size,
               TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
               BLOCK_COLS: tl.constexpr, ROUND_BF16: tl.constexpr):
        o = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS] output rows
        first = tl.program_id(1) * BLOCK_COLS
        i = first + tl.arange(0, BLOCK_COLS)  # [BLOCK_COLS] inputs
        rows_in = o < out_features
        mask = rows_in[:, None] & (i < in_features)[None, :]
        half: tl.constexpr = TILE_ROWS * TILE_COLS // 2  # bytes per tile
        tile = (o // TILE_ROWS).to(tl.int64)[:, None] * (in_features // TILE_COLS) + (i // TILE_COLS)[None, :]
        position = tl.load(natural_ptr + (o % TILE_ROWS)[:, None] * TILE_COLS + (i % TILE_COLS)[None, :]).to(tl.int32)
        byte = tl.load(packed_ptr + tile * half + position % half, mask=mask, other=0).to(tl.int32)
        q = (byte >> (4 * (position // half))) & 0xF
        # one group per program: BLOCK_COLS divides group_size
        pair = scales_and_zeros_ptr + ((first // group_size).to(tl.int64) * out_features + o) * 2
        scale = tl.load(pair, mask=rows_in, other=0.0).to(tl.float32)
        zero = tl.load(pair + 1, mask=rows_in, other=0.0).to(tl.float32)
        w = tl.fma(q.to(tl.float32) - 8.0, scale[:, None], zero[:, None])  # (q - 8) scale + zero, rounded once
        if ROUND_BF16:
            # round to nearest even on the bits: add half an ulp of bfloat16 (less one, plus the
            # kept lowest bit, so that ties go to even) and drop the low 16 bits (weights are finite)
            bits = w.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            value = bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            value = w.to(out_ptr.dtype.element_ty)  # float16: round to nearest even; float32: itself
        tl.store(out_ptr + o.to(tl.int64)[:, None] * in_features + i[None, :], value, mask=mask)

    return expand


def check_expansion(packed: Tensor, scales_and_zeros: Tensor, group_size: int, layout: TileLayout,
                    dtype: torch.dtype) -> tuple[int, int]:
    """(O, I) of the packed weight, or SpecchatError when the arguments do not describe one."""
    if scales_and_zeros.dim() != 3 or scales_and_zeros.shape[2] != 2 or not scales_and_zeros.is_contiguous():
        raise SpecchatError(f"scales_and_zeros must be a contiguous [G, O, 2]; got {tuple(scales_and_zeros.shape)}")
    groups, out_features = scales_and_zeros.shape[:2]
    in_features = groups * group_size
    if out_features % layout.rows or in_features % layout.cols:
        raise SpecchatError(f"a {out_features} x {in_features} weight is no grid of {layout.rows} x {layout.cols} "
                            "tiles")
    if packed.numel() * packed.element_size() * 2 != out_features * in_features or not packed.is_contiguous():
        raise SpecchatError(f"packed ({tuple(packed.shape)}, {packed.dtype}) is not a contiguous {out_features} x "
                            f"{in_features} int4 weight")
    if dtype not in EXPAND_DTYPES:
        raise SpecchatError(f"int4 weights expand into {', '.join(map(str, EXPAND_DTYPES))}; not {dtype}")
    devices = {packed.device, scales_and_zeros.device, layout.natural.device}
    if len(devices) != 1:
        raise SpecchatError(f"packed, scales_and_zeros and the layout must share a device; got {devices}")
    return out_features, in_features


def expand_int4(packed: Tensor, scales_and_zeros: Tensor, group_size: int, layout: TileLayout, dtype: torch.dtype,
                out: Tensor | None = None) -> Tensor:
    """The packed weight as a dense [O, I] matrix in `dtype` (into `out`, a contiguous [O, I] in
    `dtype` on the weight's device, when given): w[o, i] = (q - 8) * scale + zero."""
    import triton

    out_features, in_features = check_expansion(packed, scales_and_zeros, group_size, layout, dtype)
    if out is None:
        out = torch.empty(out_features, in_features, dtype=dtype, device=packed.device)
    elif out.shape != (out_features, in_features) or out.dtype != dtype or not out.is_contiguous() \
            or out.device != packed.device:
        raise SpecchatError(f"out must be a contiguous [{out_features}, {in_features}] {dtype} on {packed.device}; "
                            f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    block_cols = math.gcd(BLOCK_I, group_size)  # a power of two dividing the group size
    grid = (triton.cdiv(out_features, BLOCK_O), in_features // block_cols)
    _kernel(bool(triton.knobs.runtime.interpret))[grid](
        packed.reshape(-1).view(torch.uint8), layout.natural, scales_and_zeros, out, out_features, in_features,
        group_size, TILE_ROWS=layout.rows, TILE_COLS=layout.cols, BLOCK_ROWS=BLOCK_O, BLOCK_COLS=block_cols,
        ROUND_BF16=dtype == torch.bfloat16, num_warps=WARPS,
        enable_fp_fusion=False)  # the one fusion is the kernel's own fma
    return out


def chunk_rows(in_features: int, out_features: int, tile_rows: int) -> int:
    """Output rows expanded at a time: EXPAND_WEIGHTS weights, a whole number of the layout's tiles."""
    return min(out_features, max(tile_rows, EXPAND_WEIGHTS // in_features // tile_rows * tile_rows))


def expanded_workspace(in_features: int, out_features: int, rows: int, dtype: torch.dtype) -> int:
    """The bytes `expanded_linear` allocates besides its output for `rows` input rows: a chunk of
    the weight and the chunk's product (tiles of at most 64 rows)."""
    step = min(out_features, max(64, EXPAND_WEIGHTS // in_features))
    return (step * in_features + rows * step) * dtype.itemsize


def expanded_linear(x: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int,
                    layout: TileLayout) -> Tensor:
    """x [rows, I] @ w.T with w [O, I] expanded in x's dtype a chunk of whole tiles of output rows at
    a time (at most EXPAND_WEIGHTS weights: 128 MB in bf16, where a 70B MLP weight whole is 470 MB),
    each chunk's product written into its columns of the output."""
    in_features, out_features = x.shape[1], scales_and_zeros.shape[1]
    step = chunk_rows(in_features, out_features, layout.rows)
    weights = torch.empty(step * in_features, dtype=x.dtype, device=x.device)
    part = torch.empty(x.shape[0], step, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
    data = packed.reshape(-1).view(torch.uint8)
    for start in range(0, out_features, step):
        rows = min(step, out_features - start)
        chunk = data[start * in_features // 2:(start + rows) * in_features // 2]  # whole tiles: contiguous bytes
        scales = scales_and_zeros[:, start:start + rows].contiguous()
        buffer = weights[:rows * in_features].view(rows, in_features)
        weight = expand_int4(chunk, scales, group_size, layout, x.dtype, out=buffer)
        out[:, start:start + rows].copy_(torch.mm(x, weight.t(), out=part[:, :rows]))
    return out


def expand_int4_reference(packed: Tensor, scales_and_zeros: Tensor, group_size: int, layout: TileLayout,
                          dtype: torch.dtype) -> Tensor:
    """The kernel's weights by plain torch ops: (q - 8) * scale + zero exactly in float64 (exact
    for any float32 scale and zero within 2**25 of each other in size), rounded to float32 (as one
    fused multiply-add rounds) and then to `dtype`."""
    groups, out_features = scales_and_zeros.shape[:2]
    in_features = groups * group_size
    values = torch.empty(in_features, out_features, dtype=torch.uint8, device=packed.device)
    scratch = torch.empty(2 * out_features * in_features, dtype=torch.uint8, device=packed.device)
    unpack_transposed(packed, 0, layout, scratch, values)
    q = values.t().double() - 8
    scales = scales_and_zeros[..., 0].double().repeat_interleave(group_size, 0).t()
    zeros = scales_and_zeros[..., 1].double().repeat_interleave(group_size, 0).t()
    # contiguous [O, I] as the kernel writes it (q is a transposed view), so that a matmul reads both alike
    return (q * scales + zeros).float().to(dtype).contiguous()
