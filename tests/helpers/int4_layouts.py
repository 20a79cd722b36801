"""Packed int4 weights in tile layouts the tests write out themselves: int4_expand's reading of
torch's layouts (tiles of rows x cols weights in some order), so that the kernels that read them
are checked against bytes no kernel code packed."""

import torch

from specchat.quant.int4_layout import TileLayout
from specchat.quant.int4_pack import inner_k_tiles


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def scrambled_layout(rows: int, cols: int, seed: int) -> TileLayout:
    """Tiles of rows x cols weights in a seeded random order."""
    return TileLayout(rows, cols, torch.randperm(rows * cols, generator=generator(seed)), in_order=False)


def cuda_layout(in_features: int, seed: int) -> TileLayout:
    """A layout of the tile shape CUDA packs `in_features` inputs in: 8 x 16 t."""
    return scrambled_layout(8, 16 * inner_k_tiles(in_features, "cuda"), seed)


def pack_by_spec(q: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """q [O, I] (values 0..15) -> uint8 [O I / 2] in `layout`'s tiles of R x C weights, H = R C / 2
    bytes each, as int4_expand reads them:
      tile t = (o // R) * (I // C) + i // C,   position p = natural[(o % R) * C + i % C]
      q[o, i] is byte t * H + p % H's low nibble where p < H, its high nibble where p >= H."""
    out_features, in_features = q.shape
    half = layout.rows * layout.cols // 2
    o, i = torch.arange(out_features)[:, None], torch.arange(in_features)[None, :]
    tile = (o // layout.rows) * (in_features // layout.cols) + i // layout.cols
    position = layout.natural[(o % layout.rows) * layout.cols + i % layout.cols]
    byte = tile * half + position % half
    shift = 4 * (position // half)
    packed = torch.zeros(out_features * in_features // 2, dtype=torch.long)
    packed.index_add_(0, byte.reshape(-1), (q << shift).reshape(-1))  # one low and one high nibble a byte
    return packed.to(torch.uint8)


def pack_for_cuda(q: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """q [O, I] packed by the spec in `layout`'s tiles of 8 x 16 t, in CUDA's packed shape: int32
    [O/8, I/16t, 32, t/2]."""
    out_features, in_features = q.shape
    return pack_by_spec(q, layout).view(torch.int32).view(out_features // 8, in_features // layout.cols, 32,
                                                          layout.cols // 32)
