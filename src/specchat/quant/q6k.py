"""A GGUF Q6_K tensor kept in 8.6 bits a weight instead of bf16's 16, exact to gguf's own
dequantization.

Q6_K stores super-blocks of 256 weights: 6-bit values q (0..63, split into 4 low bits `ql` and
2 high bits `qh`), one int8 scale `sc` per 16 weights and one fp16 `d` per block:
  w = (d * sc) * (q - 32)
each product rounded to float32 (gguf.quants.Q6_K computes it so, and transformers dequantizes
with it). `Q6Weight` holds q - 32 as int8, sc as int8 and d widened to float32: 8 + 0.5 + 0.125
bits a weight. The LM head of the embedded 1.5B (151,936 x 1,536, Q6_K) takes 0.25 GB so instead
of 0.47 GB in bf16 (quant/q6k_linear.py multiplies it).
"""

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

Q6_K_BLOCK = 256  # weights per super-block
Q6_K_BYTES = 210  # 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 scales, an fp16 d
Q6_K_SUB = 16  # weights per scale
Q6_SUFFIXES = (".q6_values", ".q6_scales", ".q6_d")  # a module's Q6Weight in a checkpoint


@dataclass(frozen=True)
class Q6Weight:
    values: Tensor  # int8 [O, I]: q - 32, in -32..31
    scales: Tensor  # int8 [O, I / 16]
    d: Tensor  # float32 [O, I / 256]

    def dequantize(self, rows: slice = slice(None)) -> Tensor:
        """The float32 weight's `rows`, as gguf computes it (`dequantize_into`)."""
        count, width = self.values[rows].shape
        return self.dequantize_into(rows, torch.empty(count, width), torch.empty(count, width // Q6_K_SUB))

    def dequantize_into(self, rows: slice, out: Tensor, scale: Tensor) -> Tensor:
        """The float32 weight's `rows` written into `out` [n, I], `scale` [n, I / 16] its scratch:
        (d * sc) rounded to float32 (exact: an fp16 times an int8), times q - 32, rounded once."""
        # each int8 sc widened exactly, then times its block's d in place: no repeated d per chunk
        scale.copy_(self.scales[rows])
        scale.view(scale.shape[0], -1, Q6_K_BLOCK // Q6_K_SUB).mul_(self.d[rows][..., None])
        # each int8 q - 32 widened exactly, then multiplied in place: two passes of one dtype each,
        # where one multiply of the int8s by float32 scales (torch casting each element) made a
        # Q6Linear call 1.02-1.16x as long, a whole weight's expansion 4x (an AVX2 EPYC, 2026-12-01)
        out.copy_(self.values[rows])
        out.view(out.shape[0], -1, Q6_K_SUB).mul_(scale[..., None])
        return out


def q6k_to_weight(data: np.ndarray) -> Q6Weight:
    """A Q6_K tensor's bytes, uint8 [O, I / 256 * 210] (as gguf.GGUFReader gives them), as a Q6Weight."""
    out_features = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, Q6_K_BYTES)
    low, high = blocks[:, :128], blocks[:, 128:192]
    scales = blocks[:, 192:208].view(np.int8)
    d = blocks[:, 208:210].view(np.float16).astype(np.float32)
    # Each half of a block (128 weights) reads 64 bytes of `low` and 32 of `high`: weight j of its
    # four runs of 32 takes the low nibble of low[j] and low[32 + j], then their high nibbles,
    # each with the 2-bit field (0, 2, 4, 6) of high[j] in turn as its top two bits.
    low = low.reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = high.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (low & 0x0F).reshape(-1, 2, 4, 32) | ((high & 0x03) << 4)
    values = (q.astype(np.int8) - 32).reshape(out_features, -1)
    return Q6Weight(torch.from_numpy(values.copy()), torch.from_numpy(scales.reshape(out_features, -1).copy()),
                    torch.from_numpy(d.reshape(out_features, -1).copy()))


def q6_entries(module: str, weight: Q6Weight) -> dict[str, Tensor]:
    """`weight`'s checkpoint tensors under `module`'s name."""
    return dict(zip((module + suffix for suffix in Q6_SUFFIXES), (weight.values, weight.scales, weight.d)))


def q6_modules(names: Iterable[str]) -> list[str]:
    """The modules a checkpoint's tensor names hold Q6Weights for."""
    return [name.removesuffix(Q6_SUFFIXES[0]) for name in names if name.endswith(Q6_SUFFIXES[0])]


def q6_bytes(out_features: int, in_features: int) -> int:
    """Bytes of a Q6Weight of that shape."""
    weights = out_features * in_features
    return weights + weights // Q6_K_SUB + weights // Q6_K_BLOCK * 4
