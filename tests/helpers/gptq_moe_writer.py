"""Tiny random MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE) written as GPTQ checkpoints in
AutoGPTQ's and GPTQModel's per-expert layout, and the dense model of the 4-bit weights they hold.

A Mixtral checkpoint names each MoE block `block_sparse_moe` (router `block_sparse_moe.gate`, kept
dense) and expert e's linears `experts.e.w1` (gate), `w3` (up), `w2` (down); a Qwen2-MoE or
Qwen3-MoE one keeps the model's `mlp` and names them `experts.e.gate_proj`, `up_proj`, `down_proj`
(a Qwen2-MoE's shared expert quantized too, its one-output shared_expert_gate dense, as AutoGPTQ
leaves it). The names are spelled out here, apart from the loader's own table
(src/specchat/checkpoint/names.py).
"""

import json
from dataclasses import asdict
from pathlib import Path

import torch
from helpers.gptq_writer import autogptq_weight, checkpoint_tensors, pack_gptq, quantize_rtn
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import (MixtralConfig, MixtralForCausalLM, PreTrainedModel, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from specchat.quant.gptq import GPTQSpec, check_supported

EXPERTS = 4
HIDDEN = 64
# Every linear fits the CPU's int4 kernels: outputs in multiples of 64 (4 heads of 16: k and v give 64).
SHAPE = dict(vocab_size=96, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             max_position_embeddings=256, tie_word_embeddings=False,
             experts_implementation="eager")
# (gate, up, down) as each family's checkpoints name an expert's linears
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # the split model's names of an expert's linears
EXPERT_LINEARS = {"mixtral": ("w1", "w3", "w2"), "qwen2_moe": PROJECTIONS, "qwen3_moe": PROJECTIONS}


def tiny_moe(family: str, seed: int, top_k: int = 2, layers: int = 2) -> PreTrainedModel:
    """A `layers`-layer, 4-expert model of `family` routing each token to `top_k` experts, its LM
    head sharpened so that a draft's tokens are accepted."""
    torch.manual_seed(seed)
    shape = SHAPE | {"num_experts_per_tok": top_k, "num_hidden_layers": layers}
    if family == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(intermediate_size=128, num_local_experts=EXPERTS, **shape))
    elif family == "qwen2_moe":
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=128,
                                                   shared_expert_intermediate_size=128, num_experts=EXPERTS, **shape))
    else:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=128, head_dim=16,
                                                   num_experts=EXPERTS, norm_topk_prob=True, **shape))
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model.eval()


def checkpoint_name(family: str, name: str) -> str:
    """A tensor's name in `family`'s checkpoints, from its module name in the model."""
    return name.replace(".mlp.", ".block_sparse_moe.") if family == "mixtral" else name


def expert_weights(model: PreTrainedModel) -> dict[str, Tensor]:
    """Every expert's three [O, I] weights, by the split model's module names (quant/split_experts.py)."""
    weights = {}
    for layer, block in enumerate(model.model.layers):
        experts = block.mlp.experts
        intermediate = experts.down_proj.shape[2]
        for expert in range(experts.gate_up_proj.shape[0]):
            gate_up = experts.gate_up_proj[expert]
            parts = (gate_up[:intermediate], gate_up[intermediate:], experts.down_proj[expert])
            weights |= {f"model.layers.{layer}.mlp.experts.{expert}.{linear}": weight
                        for linear, weight in zip(PROJECTIONS, parts)}
    return weights


def stored_name(family: str, module: str) -> str:
    """An expert linear's module name in `family`'s checkpoints, from the split model's."""
    parent, _, linear = module.rpartition(".")
    return checkpoint_name(family, f"{parent}.{dict(zip(PROJECTIONS, EXPERT_LINEARS[family]))[linear]}")


def expert_tensors(family: str, model: PreTrainedModel, spec: GPTQSpec) -> dict[str, Tensor]:
    """Every expert's three linears, RTN-quantized one by one, under the checkpoint's names."""
    tensors = {}
    for name, weight in expert_weights(model).items():
        q = quantize_rtn(weight, spec.group_size, spec.sym, spec.desc_act)
        tensors.update({f"{stored_name(family, name)}.{key}": t for key, t in pack_gptq(q, None).items()})
    return tensors


def write_moe_gptq_checkpoint(family: str, model: PreTrainedModel, out_dir: Path, spec: GPTQSpec) -> Path:
    """`model` as a GPTQ directory in its family's per-expert layout: attention linears and every
    expert's linears RTN-quantized to 4 bits, every other tensor (the routers too) in float16."""
    settings = {"quant_method": "gptq", "checkpoint_format": "gptq", **asdict(spec)}
    check_supported(settings)
    # AutoGPTQ leaves a Qwen2-MoE's shared_expert_gate (one output) dense, as every router
    tensors = checkpoint_tensors(model, spec, lambda name: name.endswith(".shared_expert_gate"))
    dense = {checkpoint_name(family, name): tensor for name, tensor in tensors.items()
             if ".experts." not in name}  # the fused 3-D experts are stored per expert instead
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(dense | expert_tensors(family, model, spec), out_dir / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict() | {"dtype": "float16", "quantization_config": settings}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def dequantized(tensors: dict[str, Tensor], module: str, dtype: torch.dtype) -> Tensor:
    """The [O, I] weight a GPTQ module of the checkpoint holds, as AutoGPTQ reads it (not specchat)."""
    return autogptq_weight(*(tensors[f"{module}.{key}"] for key in ("qweight", "qzeros", "scales", "g_idx"))).to(dtype)


def dense_weight(family: str, tensors: dict[str, Tensor], name: str, dtype: torch.dtype) -> Tensor:
    """The model's tensor `name` of the checkpoint's weights: the fused experts stacked from each
    expert's dequantized linears, a quantized linear's weight dequantized, any other as stored."""
    gate, up, down = EXPERT_LINEARS[family]
    stored = checkpoint_name(family, name)
    if name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
        experts = stored.rpartition(".")[0]
        parts = [[gate, up]] * EXPERTS if name.endswith("gate_up_proj") else [[down]] * EXPERTS
        return torch.stack([torch.cat([dequantized(tensors, f"{experts}.{e}.{linear}", dtype) for linear in linears])
                            for e, linears in enumerate(parts)])
    if name.endswith(".weight") and stored.removesuffix(".weight") + ".qweight" in tensors:
        return dequantized(tensors, stored.removesuffix(".weight"), dtype)
    return tensors[stored].to(dtype)


def dense_model(family: str, directory: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """transformers' own model (fused experts, eager) holding the checkpoint's weights, in `dtype`."""
    tensors = load_file(directory / "model.safetensors")
    model = tiny_moe(family, seed=0).to(dtype)
    model.load_state_dict({name: dense_weight(family, tensors, name, dtype) for name in model.state_dict()})
    return model.requires_grad_(False)
