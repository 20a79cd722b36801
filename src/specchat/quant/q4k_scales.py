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
very same weights; a call spends ~6 elementwise steps over the layer's groups (G x O).
"""

import numpy as np
import torch
from torch import Tensor

from specchat.quant.gguf_int4 import SUB_BLOCKS, q4k_scale_parts, scales_and_zeros
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
        scale, zero = scales_and_zeros(self.q4k_sc, self.q4k_m, self.q4k_d, self.q4k_dmin, torch.float32)
        return torch.stack([scale, zero], dim=-1).to(self.compute_dtype)
