"""AWQ 4-bit checkpoints (AutoAWQ's GEMM format) into Int4Weight, and their layers into Int4Linear.

For a Linear with I inputs, O outputs and G groups of g inputs (group_size; -1: one group of I),
AutoAWQ's WQLinear_GEMM stores, per module:
  qweight int32 [I, O/8]  q[i, o]: packed along the outputs
  qzeros  int32 [G, O/8]  z[j, o]: packed alike, stored as they are (no GPTQ v1 minus one)
  scales  fp16  [G, O]
  bias    fp16  [O]       optional
Output column 8c + AWQ_ORDER[k] is nibble k (bits 4k..4k+3) of word c: the interleaved order of
`WQLinear_GEMM.from_linear` (awq/modules/linear/gemm.py), which awq/utils/packing_utils.py's
`reverse_awq_order` undoes. The weight nn.Linear would hold is
  W[o, i] = (q[i, o] - z[i // g, o]) * s[i // g, o].
In torch's int4 convention, w = (q - 8) * scale + zero: scale = s and zero = s * (8 - z), both exact
in float32 (s has 11 significant bits, 8 - z is -7..8), and so is (q - 8) * s + s * (8 - z) = s * (q - z).
An AWQ group of g inputs becomes g / k kernel groups of k (the largest of int4_pack's GROUP_SIZES
dividing g and I), each with its group's scale and zero. Every linear is converted once, at load:
a shape the int4 kernels cannot take is refused, never dequantized on each call.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.quant.gptq import swap_checkpoint_linears, unpack_int4_cols
from specchat.quant.int4 import Int4Linear, int4_fits, int4_tensors
from specchat.quant.int4_pack import GROUP_SIZES, nibbles_by_rows
from specchat.quant.int4_weight import Int4Weight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output column (within 8) that nibble k holds
# column 8c + m of the nibbles unpacked in bit order is output column 8c + AWQ_ORDER[m]; this reads them back
_NATURAL = torch.argsort(torch.tensor(AWQ_ORDER))
# what transformers' AwqConfig assumes for a key a config.json leaves out (or sets to null)
DEFAULTS = {"bits": 4, "group_size": 128, "zero_point": True, "version": "gemm", "backend": "autoawq"}


@dataclass(frozen=True)
class AWQSpec:
    group_size: int = 128  # -1: one group over all input rows


def read_awq_spec(config: dict) -> AWQSpec | None:
    """The AWQ settings of a config.json dict (its "quantization_config"); None when the model is
    not AWQ-quantized. A variant stored in another layout is one SpecchatError line."""
    settings = config.get("quantization_config") or {}
    if str(settings.get("quant_method", "")).lower() != "awq":
        return None
    settings = DEFAULTS | {key: value for key, value in settings.items() if value is not None}
    check_supported(settings)
    return AWQSpec(settings["group_size"])


def check_supported(settings: dict) -> None:
    # GEMV, Marlin, ExLlama and llm-awq's checkpoints pack qweight otherwise, and zero_point false
    # stores no zeros: each would convert to wrong weights without an error, so they are refused.
    version = str(settings["version"]).lower()
    if version != "gemm":
        raise SpecchatError(f"AWQ version {version!r} is not supported; only 'gemm' (AutoAWQ's default) is")
    if str(settings["backend"]).lower() != "autoawq":
        raise SpecchatError(f"AWQ checkpoints of the {settings['backend']!r} backend are not supported; only "
                            "AutoAWQ's ('autoawq') are")
    if settings["bits"] != 4:
        raise SpecchatError(f"{settings['bits']}-bit AWQ is not supported; only 4-bit AWQ is")
    if not settings["zero_point"]:
        raise SpecchatError("AWQ without zero points (zero_point false) is not supported; only AutoAWQ's "
                            "zero-point GEMM checkpoints are")
    if settings["group_size"] != -1 and settings["group_size"] <= 0:
        raise SpecchatError(f"AWQ group_size {settings['group_size']} is invalid; it must be positive or -1")


def unpack_awq(packed: Tensor) -> Tensor:
    """int32 [n, m] in AWQ's interleaved order -> uint8 [n, 8m] values in output order."""
    nibbles = unpack_int4_cols(packed)
    natural = (torch.arange(nibbles.shape[1]) // 8 * 8 + _NATURAL.repeat(packed.shape[1])).to(packed.device)
    return nibbles[:, natural]


def kernel_group_size(spec: AWQSpec, in_features: int) -> int | None:
    """The int4 kernel's group size for a layer of `spec` with `in_features` inputs; None when no
    kernel group size divides its groups."""
    group = in_features if spec.group_size == -1 else spec.group_size
    return next((k for k in reversed(GROUP_SIZES) if group % k == 0 and in_features % k == 0), None)


def awq_to_int4(qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Int4Weight:
    """One AWQ module's tensors as an Int4Weight in kernel groups of `group_size`
    (`kernel_group_size`'s: the AWQ group's size must be a multiple of it)."""
    in_features, groups = qweight.shape[0], scales.shape[0]
    if in_features % groups or in_features // groups % group_size:
        raise SpecchatError(f"an AWQ module's {groups} groups over {in_features} inputs are not multiples of the "
                            f"int4 kernel group of {group_size} its layer was built with")
    repeat = in_features // groups // group_size  # kernel groups per AWQ group
    s = scales.float().repeat_interleave(repeat, 0)
    z = unpack_awq(qzeros).float().repeat_interleave(repeat, 0)
    nibbles = nibbles_by_rows(scales.shape[1], lambda start, stop: unpack_awq(qweight[:, start // 8:stop // 8]).t())
    return Int4Weight(nibbles, s, s * (8 - z), None)


def replace_linears_with_awq(model: nn.Module, names: Iterable[str], spec: AWQSpec, dtype: torch.dtype,
                             kernel: torch.device) -> None:
    """Swap each named nn.Linear for an empty Int4Linear packed for `kernel`, on the Linear's device
    (meta in a skeleton, until filled with `awq_int4_tensors`' values); one line for a name the
    model lacks or a shape the int4 kernels cannot take."""
    def replacement(name: str, linear: nn.Linear) -> nn.Module:
        group = kernel_group_size(spec, linear.in_features)
        if group is None or not int4_fits(linear.in_features, linear.out_features, group, kernel):
            raise SpecchatError(f"AWQ layer {name!r} ({linear.out_features} x {linear.in_features}, groups of "
                                f"{spec.group_size}) does not fit {kernel.type}'s int4 kernels")
        with torch.device(linear.weight.device):
            return Int4Linear(linear.in_features, linear.out_features, group, linear.bias is not None, False, dtype,
                              kernel)

    swap_checkpoint_linears(model, names, "AWQ", replacement)


def is_awq_packed(qweight_shape: list[int], in_features: int) -> bool:
    """Whether a module's qweight is AWQ's ([I, O/8], packed along the outputs) rather than GPTQ's
    ([I/8, O], along the inputs)."""
    return qweight_shape[0] == in_features


def awq_int4_tensors(read: Callable[[str], Tensor], linear: Int4Linear) -> dict[str, Tensor]:
    """`linear`'s buffers from its AWQ checkpoint tensors, `read(name)` giving "qweight", "qzeros",
    "scales" (and "bias" when it has one), packed for its kernel's device."""
    weight = awq_to_int4(read("qweight"), read("qzeros"), read("scales"), linear.group_size)
    bias = read("bias") if linear.bias is not None else None
    return int4_tensors(weight, bias, linear.compute_dtype, torch.device(linear.kernel))
