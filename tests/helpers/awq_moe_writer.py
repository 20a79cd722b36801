"""Tiny random MoE models (Mixtral, Qwen3-MoE) written as AutoAWQ GEMM checkpoints in its
per-expert layout, and the dense model of the 4-bit weights they hold.

AutoAWQ quantizes each expert's linears on their own (its Mixtral and Qwen3-MoE models leave the
router, `gate`, in modules_to_not_convert), under the names AutoGPTQ uses too (gptq_moe_writer.py):
a Mixtral's `block_sparse_moe.experts.e.w1|w3|w2`, a Qwen3-MoE's `mlp.experts.e.gate_proj|up_proj|down_proj`.
"""

import json
from pathlib import Path

import torch
from helpers.awq_writer import GEMM, AWQDraw, checkpoint_tensors, dequantized_model, packed_tensors, quantize_awq
from helpers.gptq_moe_writer import checkpoint_name, expert_weights, stored_name
from safetensors.torch import save_file
from torch import Tensor
from transformers import PreTrainedModel


def write_moe_awq_checkpoint(family: str, model: PreTrainedModel, out_dir: Path,
                             group_size: int) -> dict[str, AWQDraw]:
    """`model` as an AutoAWQ GEMM directory in its family's per-expert layout: attention linears and
    every expert's linears quantized, every other tensor (the routers too) in float16. Returns the
    draws of the quantized linears, by the split model's module names."""
    tensors, draws = checkpoint_tensors(model, group_size)
    stored = {checkpoint_name(family, name): tensor for name, tensor in tensors.items()
              if ".experts." not in name}  # the fused 3-D experts are stored per expert instead
    experts = {name: quantize_awq(weight, group_size) for name, weight in expert_weights(model).items()}
    for name, draw in experts.items():
        stored |= packed_tensors(stored_name(family, name), draw)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(stored, out_dir / "model.safetensors", metadata={"format": "pt"})
    quantization = GEMM | {"group_size": group_size, "modules_to_not_convert": ["gate"]}
    config = model.config.to_dict() | {"dtype": "float16", "quantization_config": quantization}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return draws | experts


def fused(draws: dict[str, AWQDraw], experts: str, count: int) -> tuple[Tensor, Tensor]:
    """(gate_up_proj [E, 2I, H], down_proj [E, H, I]) of the dequantized expert linears under `experts`."""
    def weight(expert: int, linear: str) -> Tensor:
        return draws[f"{experts}.{expert}.{linear}"].dequantize()

    gate_up = torch.stack([torch.cat([weight(e, "gate_proj"), weight(e, "up_proj")]) for e in range(count)])
    return gate_up, torch.stack([weight(e, "down_proj") for e in range(count)])


def dense_moe_model(model: PreTrainedModel, draws: dict[str, AWQDraw]) -> PreTrainedModel:
    """transformers' own float32 model (fused experts, eager) holding what the checkpoint holds: its
    float16 tensors, each quantized linear's dequantized weight, the experts stacked from theirs."""
    reference = dequantized_model(model, {name: draw for name, draw in draws.items() if ".experts." not in name})
    with torch.no_grad():
        for layer, block in enumerate(reference.model.layers):
            experts = block.mlp.experts
            gate_up, down = fused(draws, f"model.layers.{layer}.mlp.experts", experts.gate_up_proj.shape[0])
            experts.gate_up_proj.copy_(gate_up.float())
            experts.down_proj.copy_(down.float())
    return reference.requires_grad_(False)
