"""A dense linear rounded to 4 bits: the draft's `int4` form (--draft-quant int4).

Round-to-nearest per group of g consecutive inputs, asymmetric: with lo and hi a group's smallest
and largest weight, scale = (hi - lo) / 15 and q = round((w - lo) / scale) in 0..15, so
w ~ q * scale + lo = (q - 8) * scale + zero with zero = lo + 8 * scale (int4_weight's convention);
each weight moves by at most scale / 2. No calibration: the draft may be approximated freely
(SpecExec's verification reads only the target's distributions), so a rounded draft grows a worse
tree at worst, never different output. The result runs through Int4Linear like a GPTQ target's
weights: the fused kernel for narrow steps, the measured wide products past them (quant/widths.py).
"""

import torch
from torch import Tensor, nn

from specchat.quant.int4 import Int4Linear, int4_fits, int4_linear
from specchat.quant.int4_pack import GROUP_SIZES, pack_nibbles
from specchat.quant.int4_weight import Int4Weight

GROUP = 128  # GPTQ's and AWQ's usual groups; a weight whose inputs it does not divide takes the largest that does


def rounded(weight: Tensor, group_size: int) -> Int4Weight:
    """`weight` [O, I] rounded to 4 bits in groups of `group_size` inputs."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = (hi - lo) / 15
    step = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: every q is 0, w = lo exactly
    q = ((groups - lo.unsqueeze(-1)) / step.unsqueeze(-1)).round().clamp(0, 15).reshape(out_features, in_features)
    return Int4Weight(pack_nibbles(q), scale.t().contiguous(), (lo + 8 * scale).t().contiguous(), None)


def group_for(linear: nn.Linear, device: torch.device) -> int | None:
    """The groups `linear` is rounded in on `device`: GROUP, or the largest of GROUP_SIZES below it
    that divides its inputs; None when the int4 kernels take none of them."""
    sizes = [size for size in sorted(GROUP_SIZES, reverse=True) if size <= GROUP]
    return next((size for size in sizes if int4_fits(linear.in_features, linear.out_features, size, device)), None)


def round_linears(module: nn.Module, dtype: torch.dtype, device: torch.device) -> int:
    """Replace every nn.Linear inside `module` that the int4 kernels take by its 4-bit rounding,
    packed for `device` in `dtype`; returns how many were replaced (the rest stay dense)."""
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            group = group_for(child, device)
            if group is not None:
                setattr(module, name, int4_linear(rounded(child.weight, group), child.bias, dtype, device))
                replaced += 1
        elif not isinstance(child, Int4Linear):
            replaced += round_linears(child, dtype, device)
    return replaced
