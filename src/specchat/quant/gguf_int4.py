"""GGUF tensors as they are multiplied here: Q4_K blocks into Int4Weight, other types dequantized.

Q4_K (ggml): super-blocks of 256 weights along a row, 144 bytes each: fp16 d and dmin, 12 bytes of
eight 6-bit scales sc and eight 6-bit mins m (one per sub-block of 32), then 128 bytes of nibbles
(bytes 32c..32c+31 hold sub-block 2c in their low nibbles, 2c+1 in their high ones). A weight is
  w = d * sc * q - dmin * m,   q in 0..15,
an asymmetric int4 group of 32: in torch's convention (q - 8) * scale + zero, scale = d * sc and
zero = 8 * scale - dmin * m. scale is exact in float32 (11 + 6 significant bits), and so is zero
whenever d and dmin are within about 2**4 of each other (the sum then spans at most 24 bits), as
they are in real models' blocks; then the float32 kernel's weight, (q - 8) * scale + zero rounded
once, is bitwise gguf's float32 dequantization (d * sc * q exact, minus dmin * m, rounded once).
Otherwise zero is rounded to float32 and the weight moves by at most 2**-24 |zero| + 2**-23 |w|.

Q6_K, Q8_0 and the rest have no 4-bit kernel. `dequantized` expands them to float32 (exact: every
product d * sc * q fits in 24 bits); a model then holds them dense in its dtype (bf16 rounds each
weight once, by at most 2**-8 of it). Measured on random Q6_K blocks of a 1536 x 8960 weight: bf16
moved weights by 0.14% of the mean |w| on average (0.35% of max |w| at most), where per-row int8
(torch's `_weight_int8pack_mm`) moved them by 1.3% (0.39% of max |w|): ten times as far.
"""

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants
from torch import Tensor

from specchat.errors import SpecchatError
from specchat.quant.int4_pack import pack_nibbles
from specchat.quant.int4_weight import Int4Weight

Q4_K_BLOCK = 256  # weights per super-block
Q4_K_BYTES = 144
Q4_K_SUB = 32  # weights per sub-block: the int4 group


SUB_BLOCKS = Q4_K_BLOCK // Q4_K_SUB


def q4k_to_int4(data: np.ndarray) -> Int4Weight:
    """A Q4_K tensor's bytes, uint8 [O, I / 256 * 144] (as gguf.GGUFReader gives them), as an
    Int4Weight in groups of 32."""
    out_features = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, Q4_K_BYTES)
    nibbles = torch.from_numpy(blocks[:, 16:].reshape(-1, 4, 1, 32).copy())  # a reader's arrays are read-only
    q = torch.cat([nibbles & 0xF, nibbles >> 4], dim=2).reshape(out_features, -1)  # [O, I], sub-blocks in order
    # computed wider, so that `zero` is rounded to float32 once
    scale, zero = scales_and_zeros(*q4k_scale_parts(data), torch.float64)
    return Int4Weight(pack_nibbles(q), scale.float(), zero.float(), None)


def q4k_scale_parts(data: np.ndarray) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A Q4_K tensor's scale parts as stored: sc and m uint8 [G, O] (6-bit), d and dmin fp16 [G/8, O]."""
    out_features = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, Q4_K_BYTES)
    sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16])  # [B, 8] each

    def per_output(values: np.ndarray) -> Tensor:  # [B, k] -> [G or G/8, O]
        return torch.from_numpy(np.ascontiguousarray(values.reshape(out_features, -1).T))

    return (per_output(sc.astype(np.uint8)), per_output(m.astype(np.uint8)),
            per_output(blocks[:, 0:2].view(np.float16)), per_output(blocks[:, 2:4].view(np.float16)))


def scales_and_zeros(sc: Tensor, m: Tensor, d: Tensor, dmin: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """scale = d * sc (exact in float32: 11 + 6 significant bits) and zero = 8 * scale - dmin * m
    [G, O], computed in `dtype`. Both products are exact in float32, so float32 rounds zero once,
    as float64 then float32 does."""
    d, dmin = (part.to(dtype).repeat_interleave(SUB_BLOCKS, 0) for part in (d, dmin))
    scale = d * sc.to(dtype)
    return scale, 8 * scale - dmin * m.to(dtype)


def matches(weight: Int4Weight, dense: Tensor) -> bool:
    """Whether `weight`'s float32 kernel weights are the dense tensor's (transformers' dequantization
    of the same blocks): bitwise, or within the bound above for a zero rounded to float32
    (2**-24 |zero| + 2**-23 |w|). The bound is computed only where the two differ."""
    if (weight.out_features, weight.in_features) != tuple(dense.shape):
        return False
    packed = weight.dequantize()
    rows, cols = differ = (packed != dense).nonzero(as_tuple=True)
    reference, zeros = dense[differ].double(), weight.zeros[cols // weight.group_size, rows].double()
    return bool(((packed[differ].double() - reference).abs() <= 2**-24 * zeros.abs() + 2**-23 * reference.abs()).all())


def dequantized(data: np.ndarray, qtype: GGMLQuantizationType) -> Tensor:
    """Any GGUF tensor's bytes (as gguf.GGUFReader gives them) as its float32 [O, I] weight."""
    if qtype == GGMLQuantizationType.Q4_K:
        raise SpecchatError("Q4_K tensors are multiplied packed: convert them with q4k_to_int4")
    return torch.from_numpy(np.ascontiguousarray(quants.dequantize(data, qtype), dtype=np.float32))
