"""A random Int4Weight of a fixed shape and group size."""

import torch

from specchat.quant.int4_pack import pack_nibbles
from specchat.quant.int4_weight import Int4Weight

OUT, IN, GROUP = 128, 256, 32


def random_weight(out_features: int = OUT, in_features: int = IN, group: int = GROUP, act_order: bool = False,
                  seed: int = 0) -> Int4Weight:
    """Scales as GPTQ's (float16) and zeros scale * (8 - z): what the converters produce."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=generator)
    scales = (torch.rand(in_features // group, out_features, generator=generator) / 32 + 1e-3).half().float()
    zeros = scales * (8 - torch.randint(1, 17, scales.shape, generator=generator))
    perm = torch.randperm(in_features, generator=generator) if act_order else None
    return Int4Weight(pack_nibbles(q), scales, zeros, perm)
