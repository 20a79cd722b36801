"""4-bit weights into the layout torch's fused int4 kernels read.

Torch's int4 matmuls take weights in a layout of their own, made by its converters:
`_convert_weight_to_int4pack_for_cpu` (int32 values [O, I] -> uint8 [O, I/2]) and, on CUDA,
`_convert_weight_to_int4pack` (uint8 [O, I/2] -> int32 [O/8, I/(16 t), 32, t/2], t inner k-tiles).
The CPU layout changes with the CPU's vector width, so packed weights are made on the machine that
multiplies them (int4_layout reads them back).

The canonical, device-independent nibbles (what the converters of this package produce and `pack`
reads) hold q[o, i] in byte i // 2 of row o, even i in the high nibble: the order CUDA's converter
reads.
"""

from collections.abc import Callable
from functools import cache

import torch
from torch import Tensor

from specchat.errors import SpecchatError

GROUP_SIZES = (32, 64, 128, 256)  # what both kernels accept
ROW_MULTIPLE = 16  # the CPU converter needs O % 16 == 0; CUDA's tiles are 8 rows
CUDA_INNER_K_TILES = (8, 4, 2)  # preferred first; I must be a multiple of 16 t
# Rows converted at a time: the CPU converter reads one int32 per weight (8x the packed bytes), so a
# whole 151936-row LM head at once would take 0.9 GB; 1024 rows take 5 bytes a weight of a row (the
# uint8 values and their int32 copy): 7.9 MB at 1536 inputs, 147 MB at 28672. A multiple of every
# layout's tile rows, so the chunks' layouts laid end to end are the whole one's.
PACK_ROWS = 1024
FUSED_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16), "cuda": (torch.bfloat16,)}  # their inputs


def pack_nibbles(q: Tensor) -> Tensor:
    """Values 0..15 [O, I] -> canonical uint8 [O, I/2] (even input index in the high nibble)."""
    pairs = q.to(torch.uint8).reshape(q.shape[0], -1, 2)
    return (pairs[..., 0] << 4) | pairs[..., 1]


def nibbles_by_rows(out_features: int, rows: Callable[[int, int], Tensor]) -> Tensor:
    """Canonical nibbles [O, I/2] made PACK_ROWS outputs at a time: `rows(start, stop)` gives the
    values 0..15 [stop - start, I] of those outputs. A checkpoint's words unpack to 1-4 bytes a
    weight before they pack to half a byte; by rows, a 28672 x 8192 linear's temporaries stay
    ~120 MB (not ~2 GB at once), so a layer converts on a GPU whose memory the plan has filled."""
    return torch.cat([pack_nibbles(rows(start, min(start + PACK_ROWS, out_features)))
                      for start in range(0, out_features, PACK_ROWS)])


def unpack_nibbles(nibbles: Tensor) -> Tensor:
    """Canonical uint8 [O, I/2] -> values 0..15 uint8 [O, I]."""
    return torch.stack([nibbles >> 4, nibbles & 0xF], dim=-1).reshape(nibbles.shape[0], -1)


@cache  # a skeleton asks once per linear: a MoE's tens of thousands, of a few widths
def inner_k_tiles(in_features: int, device_type: str) -> int:
    """CUDA's inner k-tiles for this width (1 on a CPU, whose converter ignores it)."""
    if device_type != "cuda":
        return 1
    tiles = next((t for t in CUDA_INNER_K_TILES if in_features % (16 * t) == 0), None)
    if tiles is None:
        raise SpecchatError(f"CUDA's int4 kernel needs in_features divisible by 32; got {in_features}")
    return tiles


def convert(nibbles: Tensor, device: torch.device, tiles: int) -> Tensor:
    """Canonical nibbles [O, I/2] (a few thousand rows at most) -> the kernel layout on `device`."""
    if device.type == "cuda":
        return torch.ops.aten._convert_weight_to_int4pack(nibbles.to(device).contiguous(), tiles)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_nibbles(nibbles).to(torch.int32), tiles)


def packed_shape(out_features: int, in_features: int, device_type: str) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of the kernel layout of an [O, I] weight."""
    if device_type == "cuda":
        tiles = inner_k_tiles(in_features, device_type)
        return (out_features // 8, in_features // (16 * tiles), 32, tiles // 2), torch.int32
    return (out_features, in_features // 2), torch.uint8


def check_shape(out_features: int, in_features: int, group_size: int) -> None:
    if group_size not in GROUP_SIZES or in_features % group_size or out_features % ROW_MULTIPLE:
        raise SpecchatError(f"int4 kernels need groups of {', '.join(map(str, GROUP_SIZES))} inputs dividing "
                            f"in_features and out_features divisible by {ROW_MULTIPLE}; got {out_features} x "
                            f"{in_features} in groups of {group_size}")


def pack(nibbles: Tensor, device: torch.device) -> Tensor:
    """Canonical nibbles [O, I/2] -> the kernel layout on `device`, PACK_ROWS output rows at a time.
    Done once per weight, when a model is converted or a layer file written (never per pass): on
    the dev machine's CPU (AVX2, one thread) 5-8 ns a weight, 1.2 s for the 1536 x 151936 LM head."""
    out_features, in_features = nibbles.shape[0], nibbles.shape[1] * 2
    shape, dtype = packed_shape(out_features, in_features, device.type)
    packed = torch.empty(shape, dtype=dtype, device=device)
    rows_per_entry = out_features // shape[0]  # output rows per index of the first dimension
    tiles = inner_k_tiles(in_features, device.type)
    for start in range(0, out_features, PACK_ROWS):
        stop = min(start + PACK_ROWS, out_features)
        packed[start // rows_per_entry:stop // rows_per_entry] = convert(nibbles[start:stop], device, tiles)
    return packed


def layout_key(device_type: str) -> str:
    """What a stored kernel layout depends on, for a layer file's fingerprint: torch's version and,
    on a CPU, the vector capability its kernels were picked for (AVX512 packs 64-row blocks, AVX2 32)."""
    key = f"{device_type}, torch {torch.__version__}"
    return f"{key}, {torch.backends.cpu.get_cpu_capability()}" if device_type == "cpu" else key


def fused_linear(x: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int) -> Tensor:
    """x [rows, I] @ w.T through torch's fused int4 kernel of x's device."""
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, packed, group_size, scales_and_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group_size, scales_and_zeros)
