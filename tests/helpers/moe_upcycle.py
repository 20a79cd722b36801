"""An embedded dense Qwen2 (the 1.5B target for scripts/bench_moe_specexec.py, the 0.5B for
tests/real/test_moe_upcycled_real.py) upcycled into a Qwen2-MoE, written as a GPTQ checkpoint: a MoE
target of real weights, which no package on PyPI ships.

Sparse upcycling (Komatsuzaki et al., 2022) starts a MoE from a dense model by copying its MLP into
every expert; copies would hide a routing error, since any expert's output is then the same. So
here expert e of E is the MLP less its e-th E-th of intermediate channels, the rest scaled by
E / (E - 1):

    expert_e(x) = E / (E - 1) * (MLP(x) - MLP_e(x)),   MLP_e: the MLP over channels [e I / E, (e + 1) I / E)

(its gate's rows of those channels are 0, and silu(0) * up = 0; the factor is on the down
projection). With the router's top-k weights normalized (`norm_topk_prob`, sum_i w_i = 1) a token's
output is E / (E - 1) * (MLP(x) - sum_i w_i MLP_(e_i)(x)): the dense MLP where the dropped groups
carry an E-th of it, as they do on average, so the model still writes as the 1.5B does and the
0.5B draft predicts it; yet every expert differs from every other by a group of channels, so a
token sent to the wrong expert, or experts taken in another order, changes the output. The router
is random, so tokens spread over the experts, and SpecExec over a MoE target streamed by expert can
be measured end to end, acceptance included.

Qwen2-MoE always has a shared expert; it is written with zero weights, so its output is exactly 0
(the smallest width the int4 kernels take). The MLP's linears are RTN-quantized (tests/helpers/gptq_writer.py):
the up and down projections once a layer, their packed tensors written under every expert's name,
each expert's gate on its own; the checkpoint is written a decoder layer a shard, from the dense
float32 safetensors read a tensor at a time, so that no more than a layer is held at once (8
experts in every layer: 5.5 GB of checkpoint from 1.5B weights). `dense_reference` reads it back
apart from specchat's loader, as transformers' own model.
"""

import json
import shutil
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from helpers.gptq_writer import dequantized_tensors, pack_gptq, quantize_rtn
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from transformers import PreTrainedModel, Qwen2MoeConfig, Qwen2MoeForCausalLM

from specchat.quant.gptq import GPTQSpec

SPEC = GPTQSpec(group_size=128, desc_act=False, sym=False)
SHARED = 128  # the shared expert's width: one group, every weight 0
ROUTER_STD = 0.02  # the router's random weights; the post-attention norm gives hidden states of unit scale
MLP = ("gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def upcycled_config(dense: dict, experts: int, top_k: int, moe_layers: list[int]) -> dict:
    """The Qwen2-MoE config of the dense Qwen2 config `dense` with `experts` experts of the MLP's width,
    `top_k` routed a token, in the layers `moe_layers` (the others keep their dense MLP)."""
    layers = dense["num_hidden_layers"]
    keep = {key: dense[key] for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                                        "rms_norm_eps", "rope_parameters", "bos_token_id", "eos_token_id",
                                        "pad_token_id", "tie_word_embeddings", "hidden_act")}
    config = Qwen2MoeConfig(**keep, moe_intermediate_size=dense["intermediate_size"],
                            shared_expert_intermediate_size=SHARED, num_experts=experts, num_experts_per_tok=top_k,
                            norm_topk_prob=True, qkv_bias=True, use_sliding_window=False,
                            mlp_only_layers=[i for i in range(layers) if i not in moe_layers])
    return config.to_dict() | {"architectures": ["Qwen2MoeForCausalLM"], "dtype": "float16"}


def write_upcycled(dense_dir: Path, out_dir: Path, experts: int, top_k: int, moe_layers: list[int] | None = None,
                   seed: int = 0, quantize_dense: bool = True) -> Path:
    """The upcycled checkpoint of the dense Qwen2 directory `dense_dir` in `out_dir` (written once:
    a directory with a config is taken as written); `moe_layers` None: every layer. The experts are
    4-bit; the other linears too unless `quantize_dense` is False, which writes them in float16 (a
    checkpoint may leave modules unquantized, as GPTQModel's dynamic exclusions do) and spares their
    rounding: a minute on one thread for the 1.5B's 196 linears."""
    if (out_dir / "config.json").exists():
        return out_dir
    dense = json.loads((dense_dir / "config.json").read_text())
    layers = list(range(dense["num_hidden_layers"])) if moe_layers is None else moe_layers
    generator = torch.Generator().manual_seed(seed)
    linear = packed if quantize_dense else unquantized
    out_dir.mkdir(parents=True, exist_ok=True)
    with safe_open(str(dense_dir / "model.safetensors"), framework="pt") as source:
        for layer in range(dense["num_hidden_layers"]):
            tensors = layer_tensors(source, layer, experts if layer in layers else 0, generator, linear)
            save_file(tensors, out_dir / f"model-{layer:05d}.safetensors", metadata={"format": "pt"})
        rest = {name: half(source.get_tensor(name)) for name in source.keys() if not name.startswith("model.layers.")}
        save_file(rest, out_dir / "model-rest.safetensors", metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (dense_dir / name).exists():
            shutil.copy(dense_dir / name, out_dir / name)
    settings = {"quant_method": "gptq", "checkpoint_format": "gptq", **asdict(SPEC)}
    config = upcycled_config(dense, experts, top_k, layers) | {"quantization_config": settings}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


Linear = Callable[[str, Tensor, Tensor | None], dict[str, Tensor]]


def layer_tensors(source, layer: int, experts: int, generator: torch.Generator, linear: Linear) -> dict[str, Tensor]:
    """Decoder layer `layer`'s checkpoint tensors: attention and norms as the dense model's, and its
    MLP upcycled into `experts` 4-bit experts (the module docstring) with a random router and a zero
    shared expert (0: kept dense); its other linears written by `linear`."""
    prefix = f"model.layers.{layer}."
    tensors = {prefix + name: half(source.get_tensor(prefix + name))
               for name in ("input_layernorm.weight", "post_attention_layernorm.weight")}
    for name in ATTENTION:
        bias = f"{prefix}self_attn.{name}.bias"
        tensors |= linear(f"{prefix}self_attn.{name}", source.get_tensor(f"{prefix}self_attn.{name}.weight"),
                          source.get_tensor(bias) if bias in source.keys() else None)
    weights = {name: source.get_tensor(f"{prefix}mlp.{name}.weight") for name in MLP}
    if not experts:
        return tensors | {key: t for name, weight in weights.items()
                          for key, t in linear(f"{prefix}mlp.{name}", weight).items()}
    hidden = weights["down_proj"].shape[0]
    shared_parts = {"up_proj": packed("", weights["up_proj"]),
                    "down_proj": packed("", weights["down_proj"] * (experts / (experts - 1)))}
    for expert in range(experts):
        parts = shared_parts | {"gate_proj": packed("", without_group(weights["gate_proj"], expert, experts))}
        tensors |= {f"{prefix}mlp.experts.{expert}.{name}{key}": t.clone() for name, linear in parts.items()
                    for key, t in linear.items()}  # cloned: safetensors stores no two names on one storage
    shared = {"gate_proj": (SHARED, hidden), "up_proj": (SHARED, hidden), "down_proj": (hidden, SHARED)}
    for name, shape in shared.items():
        tensors |= packed(f"{prefix}mlp.shared_expert.{name}", torch.zeros(shape))
    tensors[f"{prefix}mlp.shared_expert_gate.weight"] = torch.zeros(1, hidden, dtype=torch.float16)
    tensors[f"{prefix}mlp.gate.weight"] = half(torch.randn(experts, hidden, generator=generator) * ROUTER_STD)
    return tensors


def without_group(gate: Tensor, expert: int, experts: int) -> Tensor:
    """The gate projection [I, H] with its rows of channel group `expert` (of `experts` equal groups) 0."""
    assert gate.shape[0] % experts == 0, f"{gate.shape[0]} channels do not split into {experts} experts"
    width = gate.shape[0] // experts
    kept = gate.clone()
    kept[expert * width:(expert + 1) * width] = 0
    return kept


def packed(module: str, weight: Tensor, bias: Tensor | None = None) -> dict[str, Tensor]:
    """A linear's GPTQ tensors under `module` ("" gives the bare suffixes '.qweight', ...)."""
    parts = pack_gptq(quantize_rtn(weight, SPEC.group_size, SPEC.sym, SPEC.desc_act), bias)
    return {f"{module}.{key}": tensor for key, tensor in parts.items()}


def unquantized(module: str, weight: Tensor, bias: Tensor | None = None) -> dict[str, Tensor]:
    """A linear's float16 weight (and bias) under `module`."""
    return {f"{module}.weight": half(weight)} | ({} if bias is None else {f"{module}.bias": half(bias)})


def dense_reference(directory: Path, dtype: torch.dtype) -> PreTrainedModel:
    """transformers' own Qwen2-MoE (fused experts, eager) holding the checkpoint's weights in `dtype`,
    read apart from specchat's loader: each GPTQ linear as AutoGPTQ dequantizes it
    (gptq_writer.autogptq_weight), expert e's gate and up stacked into gate_up_proj[e] and its down
    into down_proj[e], as transformers fuses them, every other tensor as stored."""
    config = Qwen2MoeConfig.from_pretrained(directory, experts_implementation="eager")
    state: dict[str, Tensor] = {}
    for path in sorted(directory.glob("model-*.safetensors")):
        with safe_open(str(path), framework="pt") as shard:
            state |= dense_tensors({name: shard.get_tensor(name) for name in shard.keys()}, config.num_experts, dtype)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.device("meta"):
        model = Qwen2MoeForCausalLM(config)
    model.load_state_dict(state, assign=True)  # the tensors read become the parameters: no second copy
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its frequencies are no checkpoint tensor
    model.tie_weights()
    return model.eval().requires_grad_(False)


def dense_tensors(stored: dict[str, Tensor], experts: int, dtype: torch.dtype) -> dict[str, Tensor]:
    """One shard's tensors under transformers' names, in `dtype`: GPTQ modules dequantized, a layer's
    experts fused. A module at a time, so that one float32 weight is held at once, not a layer's."""
    modules: dict[str, dict[str, Tensor]] = defaultdict(dict)
    for name, tensor in stored.items():
        modules[name.rpartition(".")[0]][name] = tensor
    dense = {name: t.to(dtype) for tensors in modules.values() for name, t in dequantized_tensors(tensors).items()}
    for block in {name.partition(".experts.")[0] for name in dense if ".experts." in name}:
        gate, up, down = ([dense.pop(f"{block}.experts.{e}.{linear}.weight") for e in range(experts)] for linear in MLP)
        dense[f"{block}.experts.gate_up_proj"] = torch.stack([torch.cat(pair) for pair in zip(gate, up)])
        dense[f"{block}.experts.down_proj"] = torch.stack(down)
    return dense


def half(tensor: Tensor) -> Tensor:
    return tensor.to(torch.float16).contiguous()
