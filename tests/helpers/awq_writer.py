"""Round-to-nearest 4-bit quantization into AutoAWQ's GEMM checkpoint format, and a writer for
AutoAWQ-style model directories: tiny checkpoints for tests. Written from the format as AutoAWQ's
`WQLinear_GEMM.from_linear` (awq/modules/linear/gemm.py) packs it, independently of specchat's
reader (quant/awq.py): the draws it returns are what a test dequantizes on its own.
"""

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from helpers.gptq_writer import decoder_linears
from safetensors.torch import save_file
from torch import Tensor
from transformers import PreTrainedModel

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's: nibble k of word c holds output column 8c + AWQ_ORDER[k]
MAX_Q = 15
GEMM = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
        "modules_to_not_convert": None}


@dataclass(frozen=True)
class AWQDraw:
    """One linear's quantized values, as AutoAWQ holds them before packing."""

    q: Tensor  # int64 [I, O], 0..15
    zeros: Tensor  # int64 [G, O], 0..15
    scales: Tensor  # float16 [G, O]

    def dequantize(self) -> Tensor:
        """W[o, i] = (q[i, o] - z[i // g, o]) * s[i // g, o], float64 [O, I] (exact: 11 bits times 5)."""
        group = self.q.shape[0] // self.scales.shape[0]
        zeros = self.zeros.double().repeat_interleave(group, 0)
        scales = self.scales.double().repeat_interleave(group, 0)
        return ((self.q.double() - zeros) * scales).t()


def quantize_awq(weight: Tensor, group_size: int) -> AWQDraw:
    """Each (group of inputs, output) on its own grid s * (q - z), q in 0..15, spanning the group's
    range widened to include 0: s = (max - min) / 15, z = round(-min / s)."""
    w = weight.detach().double().t()  # [I, O], as AutoAWQ stores it
    size = w.shape[0] if group_size == -1 else group_size
    grouped = w.reshape(-1, size, w.shape[1])  # [G, g, O]
    low, high = grouped.amin(1).clamp(max=0), grouped.amax(1).clamp(min=0)
    scales = ((high - low) / MAX_Q).clamp(min=1e-5).to(torch.float16)
    zeros = torch.round(-low / scales.double()).clamp(0, MAX_Q)
    q = torch.round(grouped / scales.double()[:, None] + zeros[:, None]).clamp(0, MAX_Q)
    return AWQDraw(q.reshape(w.shape).long(), zeros.long(), scales)


def pack_awq(values: Tensor) -> Tensor:
    """Values 0..15 [n, m] -> int32 [n, m / 8] in AutoAWQ's interleaved nibble order."""
    words = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for k, column in enumerate(AWQ_ORDER):
        words |= values[:, column::8].long() << (4 * k)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # int32's two's complement


def packed_tensors(module: str, draw: AWQDraw) -> dict[str, Tensor]:
    """A quantized linear's tensors in the checkpoint, under its module name."""
    return {f"{module}.qweight": pack_awq(draw.q), f"{module}.qzeros": pack_awq(draw.zeros),
            f"{module}.scales": draw.scales.contiguous()}


def checkpoint_tensors(model: PreTrainedModel, group_size: int) -> tuple[dict[str, Tensor], dict[str, AWQDraw]]:
    """The checkpoint's tensors (decoder-layer linears packed, every other tensor float16) and the
    draws of the packed ones, by module name."""
    draws = {name: quantize_awq(linear.weight, group_size) for name, linear in decoder_linears(model).items()}
    tensors = {}
    for name, draw in draws.items():
        tensors |= packed_tensors(name, draw)
    replaced = {f"{name}.weight" for name in draws}
    for key, tensor in model.state_dict().items():
        if key not in replaced:
            tensors[key] = tensor.detach().to(torch.float16).contiguous()
    return tensors, draws


def write_awq_checkpoint(model: PreTrainedModel, out_dir: Path, group_size: int = 128,
                         settings: dict | None = None) -> dict[str, AWQDraw]:
    """Write `model` (untied) as an AutoAWQ GEMM directory with `settings` over GEMM's
    quantization_config; returns the linears' draws."""
    tensors, draws = checkpoint_tensors(model, group_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    quantization = GEMM | {"group_size": group_size} | (settings or {})
    config = model.config.to_dict() | {"dtype": "float16", "quantization_config": quantization}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return draws


def dequantized_model(model: PreTrainedModel, draws: dict[str, AWQDraw]) -> PreTrainedModel:
    """A float32 copy of `model` holding what its checkpoint holds: float16 tensors and, in each
    packed linear, its dequantized weight."""
    reference = copy.deepcopy(model).float()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.copy_(parameter.half().float())
        for name, draw in draws.items():
            reference.get_submodule(name).weight.copy_(draw.dequantize().float())
    return reference.eval()
