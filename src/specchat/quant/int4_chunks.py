"""The product of a wide input with a packed int4 weight, dequantized a chunk of output rows at a time.

The fused kernels dequantize every weight once per few input rows, so their cost grows with the
rows faster than a dense matmul's; past some width (measured at startup: quant/widths.py) it is faster
to expand the weight and run a dense matmul. Expanding all of it would take a full-size temporary
per call (4 bytes a weight in float32: 940 MB for a 8192 x 28672 linear), so it is expanded
CHUNK_WEIGHTS weights (whole output rows) at a time into buffers made once per call, and each
chunk's product is written into its columns of the output.

Dequantization reproduces the kernel's weights: w = (q - 8) * scale + zero in float32. The product
(q - 8) * scale is exact in float32 for every converter's scales (at most 20 significant bits, and
|q - 8| <= 8), so the one rounding left is that of the kernel's fused multiply-add: the float32
weights are bitwise the fused kernel's. The product runs in `product` dtype: float32 keeps them
(the input is widened, as the CPU kernel widens it), a half dtype rounds each once more (relative
error at most 2**-8 in bf16); quant/widths.py picks whichever is faster on the machine.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from specchat.quant.int4_layout import TileLayout, unpack_transposed

# Weights expanded per chunk: 1 Mi weights is a 4 MiB float32 chunk. Big enough that a chunk's dozen
# small ops cost little beside its 1 Mi weights, small enough to keep the workspace near 8 MB.
CHUNK_WEIGHTS = 1 << 20
WIDEST_TILE_ROWS = 64  # the tallest tile of any layout torch makes (CPU with AVX512)


def chunk_rows(in_features: int, out_features: int, tile_rows: int) -> int:
    """Output rows per chunk: CHUNK_WEIGHTS weights, a whole number of the layout's tiles."""
    rows = max(tile_rows, CHUNK_WEIGHTS // in_features // tile_rows * tile_rows)
    return min(rows, out_features)


def chunked_workspace(in_features: int, out_features: int, rows: int, dtype: torch.dtype, product: torch.dtype,
                      group_size: int) -> int:
    """At most the bytes of the buffers `chunked_linear` allocates besides its output, for `rows`
    input rows in `dtype` and any layout: two uint8 nibble planes, the float32 chunk, its copy in
    `product` when that is not float32, the chunk's scales and zeros in float32, and, when
    `product` is not `dtype`, the input and a chunk of output in `product`."""
    # chunk_rows is at most this for tiles of at most WIDEST_TILE_ROWS rows
    step = min(out_features, max(WIDEST_TILE_ROWS, CHUNK_WEIGHTS // in_features))
    weights = step * in_features
    total = 2 * weights + 4 * weights + 2 * 4 * step * (in_features // group_size)
    if product != torch.float32:
        total += weights * product.itemsize
    if product != dtype:
        total += rows * (in_features + step) * product.itemsize
    return total


@dataclass(frozen=True)
class ChunkBuffers:
    """What `chunked_linear` expands each chunk of C output rows into, made once per call."""

    scratch: Tensor  # uint8 [2 C I]: the chunk's nibble planes
    weights: Tensor  # float32 [C I]: the chunk, transposed
    cast: Tensor  # [C I] in the product dtype (`weights` itself when that is float32)
    scales: Tensor  # float32 [G C]
    zeros: Tensor  # float32 [G C]


def chunk_buffers(in_features: int, step: int, groups: int, product: torch.dtype, device: torch.device) -> ChunkBuffers:
    weights = torch.empty(in_features * step, dtype=torch.float32, device=device)
    scales = torch.empty(groups * step, dtype=torch.float32, device=device)
    return ChunkBuffers(
        scratch=torch.empty(2 * step * in_features, dtype=torch.uint8, device=device),
        weights=weights,
        cast=weights if product == torch.float32 else torch.empty_like(weights, dtype=product),
        scales=scales,
        zeros=torch.empty_like(scales),
    )


def dequantize_chunk(packed: Tensor, scales_and_zeros: Tensor, start: int, rows: int, group_size: int,
                     layout: TileLayout, buffers: ChunkBuffers) -> Tensor:
    """Output rows start..start + rows of the weight, transposed: float32 [I, rows]."""
    groups = scales_and_zeros.shape[0]
    weights = buffers.weights[:groups * group_size * rows].view(-1, rows)
    unpack_transposed(packed, start, layout, buffers.scratch, weights)
    # contiguous copies: the in-place ops below ran ~5x slower on the interleaved originals
    scales = buffers.scales[:groups * rows].view(groups, 1, rows)
    zeros = buffers.zeros[:groups * rows].view(groups, 1, rows)
    scales[:, 0].copy_(scales_and_zeros[:, start:start + rows, 0])
    zeros[:, 0].copy_(scales_and_zeros[:, start:start + rows, 1])
    weights.view(groups, group_size, rows).sub_(8).mul_(scales).add_(zeros)  # (q - 8) * scale + zero
    return weights


def operand(weights: Tensor, buffers: ChunkBuffers) -> Tensor:
    """The chunk [I, C] as the dense product reads it: itself in float32; in a half dtype, cast into
    [C, I] and transposed (a half-precision matmul reading a row-major [I, C] operand ran 5x slower
    here, AVX2, than one reading nn.Linear's own layout)."""
    if buffers.cast is buffers.weights:
        return weights
    in_features, rows = weights.shape
    return buffers.cast[:in_features * rows].view(rows, in_features).copy_(weights.t()).t()


def chunked_linear(x: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int, layout: TileLayout,
                   product: torch.dtype) -> Tensor:
    """x [rows, I] @ w.T for the packed weight w [O, I] (O a multiple of layout.rows), the dense
    products in `product` dtype, the output in x's."""
    in_features, out_features = x.shape[1], scales_and_zeros.shape[1]
    step = chunk_rows(in_features, out_features, layout.rows)
    buffers = chunk_buffers(in_features, step, scales_and_zeros.shape[0], product, x.device)
    out = torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
    wide = x.to(product)  # x itself when it is already in `product`
    part = None if product == x.dtype else torch.empty(x.shape[0], step, dtype=product, device=x.device)
    for start in range(0, out_features, step):
        rows = min(step, out_features - start)
        weights = operand(dequantize_chunk(packed, scales_and_zeros, start, rows, group_size, layout, buffers), buffers)
        columns = out[:, start:start + rows]
        if part is None:
            torch.mm(wide, weights, out=columns)
        else:
            columns.copy_(torch.mm(wide, weights, out=part[:, :rows]))
    return out


def dequantized(packed: Tensor, scales_and_zeros: Tensor, group_size: int, layout: TileLayout,
                dtype: torch.dtype) -> Tensor:
    """The whole weight [O, I] in `dtype`, expanded in float32 a chunk of output rows at a time (so
    that the float32 temporaries stay a few MB) and rounded once: a dense copy of it."""
    groups, out_features = scales_and_zeros.shape[:2]
    in_features = groups * group_size
    step = chunk_rows(in_features, out_features, layout.rows)
    buffers = chunk_buffers(in_features, step, groups, torch.float32, packed.device)
    weight = torch.empty(out_features, in_features, dtype=dtype, device=packed.device)
    for start in range(0, out_features, step):
        rows = min(step, out_features - start)
        weight[start:start + rows].copy_(
            dequantize_chunk(packed, scales_and_zeros, start, rows, group_size, layout, buffers).t())
    return weight
