"""An Int4Linear whose scales and zeros stream as Q4_K stores them: 5 bytes a 256-weight block's
8 groups less than the bf16 pairs the kernels take.

Int4Linear holds scales_and_zeros [G, O, 2] in the compute dtype: 4 bytes per group of 32 weights
in bf16, 1 bit a weight, 0.14 GB of each pass of the embedded 1.5B's streamed layers. Q4_K keeps,
per group, a 6-bit scale sc and a 6-bit min m, and per super-block of 8 groups an fp16 d and dmin;
held here as uint8 sc and m [G, O] and fp16 d and dmin [G/8, O] (0.625 bits a weight), the pairs are
made again on each call:
  scale = d * sc           exact in float32 (11 + 6 significant bits)
  zero  = 8 * scale - dmin * m, rounded once to float32
which is what quant/gguf_int4.q4k_to_int4 stores (computed wider, rounded once: the same float32),
then rounded to the compute dtype as Int4Linear's packing rounds it. So the kernel multiplies the
very same weights; a call spends 4 elementwise steps over the layer's groups (G x O), written in
place into the [G, O, 2] pairs, d and dmin broadcast over their 8 groups (the pairs made by
stacking repeated copies cost twice as long: 6.7 ms against 3.3 for a 1536 x 8960 linear).
"""

import numpy as np
import torch
from torch import Tensor

from specchat.quant.gguf_int4 import SUB_BLOCKS, q4k_scale_parts
from specchat.quant.int4 import Int4Linear

Q4K_SUFFIXES = (".q4k_sc", ".q4k_m", ".q4k_d", ".q4k_dmin")  # a module's Q4_K scale parts in a checkpoint


def q4k_entries(module: str, data: np.ndarray) -> dict[str, Tensor]:
    """A Q4_K tensor's scale parts (gguf_int4.q4k_scale_parts) as checkpoint tensors under `module`'s name."""
    return dict(zip((module + suffix for suffix in Q4K_SUFFIXES), q4k_scale_parts(data)))


class Q4KScalesLinear(Int4Linear):
    """An Int4Linear whose scales and zeros are made from Q4_K's parts on each call."""

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool, act_order: bool,
                 dtype: torch.dtype, kernel: torch.device) -> None:
        super().__init__(in_features, out_features, group_size, bias, act_order, dtype, kernel)
        del self._buffers["scales_and_zeros"]
        groups = in_features // group_size
        for suffix, shape, kind in zip(Q4K_SUFFIXES, [(groups, out_features)] * 2 + [(groups // SUB_BLOCKS, out_features)] * 2,
                                       (torch.uint8, torch.uint8, torch.float16, torch.float16)):
            self.register_buffer(suffix.removeprefix("."), torch.empty(shape, dtype=kind))

    def group_scales(self) -> Tensor:
        groups, outputs = self.q4k_sc.shape
        pairs = torch.empty(groups, outputs, 2, device=self.q4k_sc.device)  # float32, as gguf computes
        blocks = (groups // SUB_BLOCKS, SUB_BLOCKS, outputs)  # a super-block's 8 groups share its d and dmin
        scale, zero = pairs[..., 0].view(blocks), pairs[..., 1].view(blocks)
        torch.mul(self.q4k_sc.view(blocks), self.q4k_d.float()[:, None], out=scale)  # exact
        torch.mul(self.q4k_m.view(blocks), self.q4k_dmin.float()[:, None], out=zero)  # exact
        zero.neg_().add_(scale, alpha=8)  # 8 * scale exact too: the sum rounds once
        return pairs.to(self.compute_dtype)
