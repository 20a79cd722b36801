"""Reading torch's int4 layouts back: which packed nibble holds which weight, learned by experiment.

The CPU converter's layout changes with the CPU's vector width (blocks of 64 output rows with
AVX512, 32 with AVX2, pairs of rows without either) and CUDA's is undocumented, so neither is
written down here: `layout_of` converts index patterns on the machine at hand and reads where each
index landed. Every layout torch 2.13 makes is a grid of tiles of `rows` x `cols` weights, the
tiles in row-major order (output-row tiles outer), each tile in `rows * cols / 2` consecutive bytes
and in one fixed order; that order is all that reading the weights back needs.

A tile's bytes are read as two planes, the low nibbles of its bytes then the high ones: on x86
that is already row order (AVX2 byte d holds rows d and d + 16 of a 32-row block), so the
reordering step is skipped there.
"""

import math
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

from specchat.quant.int4_pack import convert, inner_k_tiles, pack_nibbles


@dataclass(frozen=True)
class TileLayout:
    """Tiles of `rows` x `cols` weights; weight r * cols + c of a tile sits at position
    `natural[r * cols + c]` of the tile's planes (low nibbles of its bytes, then high nibbles)."""

    rows: int
    cols: int
    natural: Tensor  # long [rows * cols], on the kernel's device
    in_order: bool  # natural is the identity


def layout_for(device: torch.device, in_features: int) -> TileLayout | None:
    return layout_of(device.type, inner_k_tiles(in_features, device.type))


@cache
def layout_of(device_type: str, tiles: int) -> TileLayout | None:
    """The tile layout of torch's int4 converter on `device_type` (with `tiles` inner k-tiles on
    CUDA), learned once per process from a probe of at least two tiles each way (CPU tiles are at
    most 64 x 1; CUDA's 8 x 16 t, as its documented shape [O/8, I/16t, 32, t/2] suggests: no GPU
    has run this yet); None when the layout is no grid of tiles (a torch to come), and then wide
    inputs run the fused kernel too."""
    rows, cols = (512, 8) if device_type == "cpu" else (32, 32 * tiles)
    source = learn_sources(rows, cols, torch.device(device_type), tiles)
    for tile_rows, tile_cols in sorted(tile_shapes(rows, cols), key=lambda shape: (shape[0] * shape[1], shape[0])):
        natural = fit_tiles(source, cols, tile_rows, tile_cols)
        if natural is not None:
            in_order = torch.equal(natural, torch.arange(natural.numel()))
            return TileLayout(tile_rows, tile_cols, natural.to(device_type), in_order)
    return None


def planes(packed: Tensor, tile_bytes: int, out: Tensor) -> Tensor:
    """The packed bytes as [tiles, 2, tile_bytes]: each tile's low nibbles, then its high ones."""
    data = packed.reshape(-1).view(torch.uint8).view(-1, tile_bytes)
    split = out.view(-1, 2, tile_bytes)
    torch.bitwise_and(data, 0xF, out=split[:, 0])
    torch.bitwise_right_shift(data, 4, out=split[:, 1])
    return split


def learn_sources(rows: int, cols: int, device: torch.device, tiles: int) -> Tensor:
    """For each nibble of the packed bytes of a [rows, cols] weight, in stream order (byte by byte,
    low nibble first), which weight (o * cols + i) the converter put there: the index is converted
    4 bits at a time and reassembled."""
    index = torch.arange(rows * cols).reshape(rows, cols)
    source = torch.zeros(rows * cols, dtype=torch.long)
    for shift in range(0, 4 * math.ceil(math.log2(rows * cols) / 4), 4):
        data = convert(pack_nibbles((index >> shift) & 0xF), device, tiles).reshape(-1).view(torch.uint8).cpu()
        digits = torch.stack([data & 0xF, data >> 4], dim=-1).reshape(-1)
        source |= digits.long() << shift
    return source


def tile_shapes(rows: int, cols: int) -> list[tuple[int, int]]:
    """Candidate tiles: powers of two, at least two tiles each way in the probe, whole bytes."""
    return [(1 << r, 1 << c) for r in range(int(math.log2(rows))) for c in range(int(math.log2(cols))) if r + c > 0]


def fit_tiles(source: Tensor, cols: int, tile_rows: int, tile_cols: int) -> Tensor | None:
    """`natural` if `source` is a row-major grid of tile_rows x tile_cols tiles that all share
    the first tile's order; None otherwise."""
    size = tile_rows * tile_cols
    tiles = source.reshape(-1, size)
    tile_row, tile_col = tiles // cols // tile_rows, tiles % cols // tile_cols
    expected = torch.arange(tiles.shape[0])[:, None].expand_as(tiles)
    if not torch.equal(tile_row * (cols // tile_cols) + tile_col, expected):
        return None
    within = (tiles // cols % tile_rows) * tile_cols + tiles % tile_cols
    if not torch.equal(within, within[:1].expand_as(within)):
        return None
    stream = torch.arange(size)
    plane_position = stream % 2 * (size // 2) + stream // 2  # nibble p is byte p // 2's, low first
    natural = torch.empty(size, dtype=torch.long)
    natural[within[0]] = plane_position
    return natural


def unpack_transposed(packed: Tensor, start: int, layout: TileLayout, scratch: Tensor, out: Tensor) -> None:
    """Write the values 0..15 of output rows start..start + C (C and start multiples of
    layout.rows) of a packed [O, I] weight, transposed, into `out` [I, C] (any dtype): the
    operand a row-major matmul reads. `scratch`: uint8, 2 C I bytes."""
    in_features, rows = out.shape
    size = rows * in_features
    tile = layout.rows * layout.cols
    data = packed.reshape(-1).view(torch.uint8)[start * in_features // 2:(start + rows) * in_features // 2]
    split = planes(data, tile // 2, scratch[:size])
    if layout.in_order:
        ordered = split.view(-1, tile)
    else:
        ordered = scratch[size:2 * size].view(-1, tile)
        torch.index_select(split.view(-1, tile), 1, layout.natural, out=ordered)
    grid = ordered.view(rows // layout.rows, in_features // layout.cols, layout.rows, layout.cols)
    # out[k, o] with k = tile column * cols + c, o = tile row * rows + r
    out.view(in_features // layout.cols, layout.cols, rows // layout.rows, layout.rows).copy_(grid.permute(1, 3, 0, 2))
