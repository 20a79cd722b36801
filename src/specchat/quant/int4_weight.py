"""A 4-bit weight in torch's int4 convention, independent of any device's kernel layout.

A weight of O outputs and I inputs in G groups of g = I / G consecutive inputs:
  w[o, i] = (q[o, i] - 8) * scale[i // g, o] + zero[i // g, o],   q in 0..15
(the convention of torch's fused int4 kernels on both devices; int4_gptq and gguf_int4 convert
their sources into it). Inputs are those of the weight; with act-order GPTQ they are the layer's
inputs permuted so that groups are contiguous: input i of the weight is input perm[i] of the layer.
Scales and zeros are float32, which holds every converter's exactly; a kernel that wants another
dtype rounds them when the weight is packed for it.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from specchat.quant.int4_pack import unpack_nibbles

# Rows dequantized at a time: their float64 temporaries (~10 MB at 8960 inputs) stay near the core
# where the whole weight's went to memory. One thread, 8960 x 1536: 0.069 s against 0.143 s whole,
# 0.655 s with each group's scale and zero repeated over its inputs (AMX Xeon, 2026-12-08).
ROWS_A_PIECE = 128


@dataclass(frozen=True)
class Int4Weight:
    nibbles: Tensor  # uint8 [O, I/2], int4_pack's canonical order
    scales: Tensor  # float32 [G, O]
    zeros: Tensor  # float32 [G, O]
    perm: Tensor | None  # long [I]; None: the identity

    @property
    def out_features(self) -> int:
        return self.nibbles.shape[0]

    @property
    def in_features(self) -> int:
        return self.nibbles.shape[1] * 2

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[0]

    def dequantize(self) -> Tensor:
        """The float32 [O, I] weight over the layer's own inputs, as the float32 kernel computes it:
        (q - 8) * scale + zero exactly, then rounded once (a fused multiply-add). Computed
        ROWS_A_PIECE rows at a time, each group's scale and zero broadcast over its inputs."""
        weight = torch.empty(self.out_features, self.in_features, dtype=torch.float32, device=self.nibbles.device)
        for start in range(0, self.out_features, ROWS_A_PIECE):
            rows = slice(start, start + ROWS_A_PIECE)
            weight[rows] = self.dequantized_rows(rows)
        if self.perm is None:
            return weight
        unpermuted = torch.empty_like(weight)
        unpermuted[:, self.perm] = weight
        return unpermuted

    def dequantized_rows(self, rows: slice) -> Tensor:
        """Those rows of the weight, in the inputs' stored order."""
        q = unpack_nibbles(self.nibbles[rows]).double().sub_(8)
        q = q.view(q.shape[0], self.scales.shape[0], self.group_size)  # [r, G, g]
        per_group = [part[:, rows].t().double().unsqueeze(-1) for part in (self.scales, self.zeros)]  # [r, G, 1]
        # float64 holds (q - 8) * scale + zero exactly unless zero and scale are 2**25 apart in size
        return q.mul_(per_group[0]).add_(per_group[1]).view(q.shape[0], -1).float()
