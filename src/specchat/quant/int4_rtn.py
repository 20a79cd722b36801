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
# Rows rounded at a time: a block's float32 copy, quotient and rounded values are its temporaries
# (3 x 256 x 11008 x 4 bytes = 34 MB for a 7B's down projection), whatever the weight's size.
ROUND_ROWS = 256


def rounded(weight: Tensor, group_size: int) -> Int4Weight:
    """`weight` [O, I] rounded to 4 bits in groups of `group_size` inputs, ROUND_ROWS rows at a time."""
    blocks = [rounded_rows(weight[start:start + ROUND_ROWS].detach(), group_size)
              for start in range(0, weight.shape[0], ROUND_ROWS)]
    nibbles, scales, zeros = (torch.cat(parts, dim) for parts, dim in zip(zip(*blocks), (0, 1, 1)))
    return Int4Weight(nibbles, scales, zeros, None)


def rounded_rows(rows: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rows [n, I] as (nibbles [n, I/2], scales [G, n], zeros [G, n])."""
    count, in_features = rows.shape
    groups = rows.float().reshape(count, in_features // group_size, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = (hi - lo) / 15
    step = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: every q is 0, w = lo exactly
    q = ((groups - lo.unsqueeze(-1)) / step.unsqueeze(-1)).round_().clamp_(0, 15).reshape(count, in_features)
    return pack_nibbles(q), scale.t().contiguous(), (lo + 8 * scale).t().contiguous()


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
