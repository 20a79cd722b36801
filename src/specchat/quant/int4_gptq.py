"""GPTQ checkpoints into Int4Weight, and GPTQ layers into Int4Linear.

GPTQ (quant/gptq.py) stores W[o, i] = s[g(i), o] * (q[i, o] - z[g(i), o]), z in 1..16, s fp16.
In torch's convention, w = (q - 8) * scale + zero, that is scale = s and zero = s * (8 - z): both
exact in float32 (s has 11 significant bits, 8 - z is -8..7), and so is every weight the float32
kernel computes from them, (q - 8) * s + s * (8 - z) = s * (q - z).

Groups: with act-order, g_idx is an arbitrary map of inputs to groups. The inputs are sorted by
group once, at conversion (`perm`), so that each group is a contiguous run, and the layer permutes
its input the same way at run time; a GPTQ group of g inputs becomes g / k kernel groups of k
(the largest of 256, 128, 64, 32 that divides every group's size), all with the group's scale and
zero. GPTQ's group_size -1 (one group over all inputs) becomes I / k groups likewise.
"""

from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.quant.gptq import GPTQSpec, gptq_linear, swap_checkpoint_linears, unpack_int4_cols, unpack_int4_rows
from specchat.quant.int4 import Int4Linear, int4_fits, int4_tensors
from specchat.quant.int4_pack import GROUP_SIZES, nibbles_by_rows
from specchat.quant.int4_weight import Int4Weight


def spec_group_size(spec: GPTQSpec, in_features: int) -> int | None:
    """The kernel group size for a layer of `spec` with `in_features` inputs (group_size -1: one
    group); None when no kernel group size divides its groups."""
    group = in_features if spec.group_size == -1 else spec.group_size
    return next((k for k in reversed(GROUP_SIZES) if group % k == 0 and in_features % k == 0), None)


def gptq_to_int4(qweight: Tensor, qzeros: Tensor, scales: Tensor, g_idx: Tensor, group_size: int) -> Int4Weight:
    """One GPTQ module's tensors (quant/gptq.py's format) as an Int4Weight in kernel groups of
    `group_size` (`spec_group_size`'s: every GPTQ group's size must be a multiple of it)."""
    groups = g_idx.long()
    order = torch.argsort(groups, stable=True)
    counts = torch.bincount(groups, minlength=scales.shape[0])
    if any(count % group_size for count in counts.tolist()):
        raise SpecchatError(f"a GPTQ module's groups hold {sorted(set(counts.tolist()))} inputs: not multiples of "
                            f"the int4 kernel group of {group_size} its layer was built with")
    def values(start: int, stop: int) -> Tensor:  # outputs start..stop, [O, I], inputs sorted by group
        return unpack_int4_rows(qweight[:, start:stop]).t()[:, order]

    nibbles = nibbles_by_rows(qweight.shape[1], values)
    source_group = groups[order][::group_size]  # the GPTQ group of each kernel group
    s = scales.float()[source_group]
    z = unpack_int4_cols(qzeros).float()[source_group] + 1  # v1 stores z - 1
    identity = torch.equal(order, torch.arange(order.numel(), device=order.device))
    return Int4Weight(nibbles, s, s * (8 - z), None if identity else order)


def replace_linears_with_gptq_int4(model: nn.Module, names: Iterable[str], spec: GPTQSpec, dtype: torch.dtype,
                                   kernel: torch.device) -> None:
    """Swap each named nn.Linear for an empty Int4Linear packed for `kernel`, on the Linear's device
    (meta in a skeleton, until filled with `gptq_int4_tensors`' values). One whose shape the kernels
    cannot take (`int4_fits`: groups under 32 inputs, say) becomes an empty GPTQLinear instead,
    dequantized per call, which refuses sizes GPTQ cannot pack (those int4_fits takes, inputs in 32s
    and outputs in 16s, it can). No GPTQLinear is built on the way to an Int4Linear: a 235B MoE has 36096."""
    def replacement(name: str, linear: nn.Linear) -> nn.Module:
        group_size = spec_group_size(spec, linear.in_features)
        if group_size is None or not int4_fits(linear.in_features, linear.out_features, group_size, kernel):
            return gptq_linear(name, linear, spec)
        with torch.device(linear.weight.device):
            return Int4Linear(linear.in_features, linear.out_features, group_size, linear.bias is not None,
                              spec.desc_act, dtype, kernel)

    swap_checkpoint_linears(model, names, "GPTQ", replacement)


def gptq_int4_tensors(read: Callable[[str], Tensor], linear: Int4Linear) -> dict[str, Tensor]:
    """`linear`'s buffers from its GPTQ checkpoint tensors, `read(name)` giving "qweight",
    "qzeros", "scales", "g_idx" (and "bias" when it has one), packed for its kernel's device."""
    weight = gptq_to_int4(read("qweight"), read("qzeros"), read("scales"), read("g_idx"), linear.group_size)
    if linear.perm is None and weight.perm is not None:
        raise SpecchatError("a GPTQ module's g_idx is not in input order, but its checkpoint does not declare desc_act")
    if linear.perm is not None and weight.perm is None:
        weight = replace(weight, perm=torch.arange(linear.in_features))
    bias = read("bias") if linear.bias is not None else None
    return int4_tensors(weight, bias, linear.compute_dtype, torch.device(linear.kernel))
