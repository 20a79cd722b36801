"""GPTQ 4-bit weights (the AutoGPTQ / TheBloke checkpoint format), dequantized in pure torch.

For a Linear with I inputs, O outputs and G groups a checkpoint stores, per module:
  qweight int32 [I/8, O]  input row i of column o is nibble i % 8 of qweight[i // 8, o]
  qzeros  int32 [G, O/8]  zero of group j, column o is nibble o % 8 of qzeros[j, o // 8], minus one
  scales  fp16  [G, O]
  g_idx   int32 [I]       group of each input row (i // group_size, or any map with act-order)
  bias    fp16  [O]       optional
and the weight nn.Linear would hold is W[o, i] = scales[g_idx[i], o] * (q[i, o] - zero[g_idx[i], o]).
Nibble k is bits 4k..4k+3. The packed tensors stay as they are until the matmul that needs them.
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specchat.errors import SpecchatError

NIBBLES = 8  # 4-bit values per int32 word


@dataclass(frozen=True)
class GPTQSpec:
    bits: int = 4
    group_size: int = 128  # -1: one group over all input rows
    desc_act: bool = False  # act-order: g_idx is an arbitrary map, not i // group_size
    sym: bool = True


def read_gptq_spec(config: dict) -> GPTQSpec | None:
    """The GPTQ settings of a config.json dict (its "quantization_config") or of a
    quantize_config.json dict; None when the model is not GPTQ-quantized."""
    settings = config.get("quantization_config", config)
    if str(settings.get("quant_method", "gptq")).lower() != "gptq" or "bits" not in settings:
        return None
    check_supported(settings)
    defaults = GPTQSpec()
    return GPTQSpec(
        bits=settings["bits"],
        group_size=settings.get("group_size", defaults.group_size),
        desc_act=bool(settings.get("desc_act", defaults.desc_act)),
        sym=bool(settings.get("sym", defaults.sym)),
    )


def check_supported(settings: dict) -> None:
    # "gptq_v2" stores zeros without the minus one and "marlin" repacks qweight; both would
    # dequantize to wrong weights here without any error, so they are refused up front.
    layout = "marlin" if settings.get("is_marlin_format") else \
        settings.get("checkpoint_format", settings.get("format", "gptq"))
    if layout != "gptq":
        raise SpecchatError(f"GPTQ checkpoint format {layout!r} is not supported; only 'gptq' (v1) is")
    if settings["bits"] != 4:
        raise SpecchatError(f"{settings['bits']}-bit GPTQ is not supported; only 4-bit GPTQ is")
    if settings.get("pack_dtype", "int32") != "int32":
        raise SpecchatError(f"GPTQ packed as {settings['pack_dtype']} is not supported; only int32 is")
    group_size = settings.get("group_size", GPTQSpec.group_size)
    if group_size != -1 and group_size <= 0:
        raise SpecchatError(f"GPTQ group_size {group_size} is invalid; it must be positive or -1")


def nibble_shifts(device: torch.device) -> Tensor:
    return torch.arange(0, 32, 4, dtype=torch.int32, device=device)


def unpack_int4_rows(packed: Tensor) -> Tensor:
    """int32 [n, m] -> uint8 [8n, m]: row 8r + k is nibble k of packed row r."""
    # `>>` is arithmetic on int32, so a word with its top nibble >= 8 (negative) drags sign bits
    # down; the & 0xF drops them.
    nibbles = (packed.unsqueeze(1) >> nibble_shifts(packed.device).view(1, NIBBLES, 1)) & 0xF
    return nibbles.reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_int4_cols(packed: Tensor) -> Tensor:
    """int32 [n, m] -> uint8 [n, 8m]: column 8c + k is nibble k of packed column c."""
    nibbles = (packed.unsqueeze(2) >> nibble_shifts(packed.device).view(1, 1, NIBBLES)) & 0xF
    return nibbles.reshape(packed.shape[0], -1).to(torch.uint8)


def pack_words(nibbles: Tensor, dim: int) -> Tensor:
    """Sum the 8 nibbles along `dim` of an int tensor of values 0..15 into int32 words."""
    shifts = nibble_shifts(nibbles.device).to(torch.int64)
    shape = [1] * nibbles.dim()
    shape[dim] = NIBBLES
    words = (nibbles.to(torch.int64) << shifts.view(shape)).sum(dim)  # nibbles never overlap
    # The cast keeps the low 32 bits: a word >= 2**31 becomes the negative int32 of its bits.
    return words.to(torch.int32)


def pack_int4_rows(values: Tensor) -> Tensor:
    """Values 0..15 [8n, m] -> int32 [n, m]; inverse of unpack_int4_rows."""
    return pack_words(values.reshape(-1, NIBBLES, values.shape[1]), dim=1)


def pack_int4_cols(values: Tensor) -> Tensor:
    """Values 0..15 [n, 8m] -> int32 [n, m]; inverse of unpack_int4_cols."""
    return pack_words(values.reshape(values.shape[0], -1, NIBBLES), dim=2)


def dequantize(qweight: Tensor, qzeros: Tensor, scales: Tensor, g_idx: Tensor, dtype: torch.dtype) -> Tensor:
    """The [O, I] weight nn.Linear would hold, in `dtype`, on the inputs' device."""
    groups = g_idx.long()
    q = unpack_int4_rows(qweight).to(dtype)  # [I, O]
    zeros = (unpack_int4_cols(qzeros).to(dtype) + 1)[groups]  # v1 stores zero - 1
    # [I, O] -> its transpose is a view; F.linear multiplies by W.T, which is this contiguous one.
    return (scales.to(dtype)[groups] * (q - zeros)).t()


class GPTQLinear(nn.Module):
    """A Linear whose weight is kept packed (as buffers, so they travel with state_dict) and is
    dequantized to the input's dtype on every forward."""

    def __init__(
        self, in_features: int, out_features: int, group_count: int, bias: bool,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        int32 = {"dtype": torch.int32, "device": device}
        self.register_buffer("qweight", torch.zeros(in_features // NIBBLES, out_features, **int32))
        self.register_buffer("qzeros", torch.zeros(group_count, out_features // NIBBLES, **int32))
        self.register_buffer("scales", torch.zeros(group_count, out_features, dtype=torch.float16, device=device))
        self.register_buffer("g_idx", torch.zeros(in_features, **int32))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float16, device=device) if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        weight = dequantize(self.qweight, self.qzeros, self.scales, self.g_idx, x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, groups={self.scales.shape[0]}"


def group_count(in_features: int, group_size: int) -> int:
    return 1 if group_size == -1 else math.ceil(in_features / group_size)


def swap_checkpoint_linears(model: nn.Module, names: Iterable[str], method: str,
                            replacement: Callable[[str, nn.Linear], nn.Module]) -> None:
    """Put `replacement(name, linear)` in place of each nn.Linear a `method` (GPTQ, AWQ) checkpoint
    quantizes under `name`, its parent found once (a 235B MoE names 36096); one line where the model
    has no Linear there."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name)
            linear = getattr(parent, child)
        except AttributeError as error:
            raise SpecchatError(f"{method} checkpoint names {name!r}, which the model does not have") from error
        if not isinstance(linear, nn.Linear):
            raise SpecchatError(f"{method} checkpoint quantizes {name!r}, which is not a Linear layer")
        setattr(parent, child, replacement(name, linear))


def replace_linears_with_gptq(model: nn.Module, names: Iterable[str], spec: GPTQSpec) -> None:
    """Swap each named nn.Linear for an empty GPTQLinear of the same shape and device."""
    swap_checkpoint_linears(model, names, "GPTQ", lambda name, linear: gptq_linear(name, linear, spec))


def check_gptq_shape(name: str, linear: nn.Linear) -> None:
    """One line where GPTQ cannot pack `linear` (named `name`): its sizes must divide by 8."""
    if linear.in_features % NIBBLES or linear.out_features % NIBBLES:
        raise SpecchatError(f"GPTQ needs Linear sizes divisible by 8; {name!r} is {linear.weight.shape}")


def gptq_linear(name: str, linear: nn.Linear, spec: GPTQSpec) -> GPTQLinear:
    """An empty GPTQLinear of `linear`'s shape and device, for the checkpoint's module `name`."""
    check_gptq_shape(name, linear)
    return GPTQLinear(linear.in_features, linear.out_features, group_count(linear.in_features, spec.group_size),
                      bias=linear.bias is not None, device=linear.weight.device)
