"""The scale check's models, from the shipped alias configs with random weights (nothing is
downloaded): the target as a GPTQ or AWQ checkpoint of random 4-bit weights, written straight in the
format (random packed words, one scale per group and output) without a float model to quantize,
which at 70B shapes would take minutes and tens of GB; the draft as a bf16 model in memory. A MoE
target's experts are written one by one, as AutoGPTQ stores them; the checkpoint is written a
decoder layer a shard, so that no more than one layer is ever held in memory."""

import json
import math
from pathlib import Path

import torch
from helpers.gptq_writer import decoder_linears
from safetensors.torch import save_file
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from specchat.bounded_attention import bound_attention
from specchat.models.configs import shipped_config_path
from specchat.models.draft import DraftQuant, approximation
from specchat.quant.gptq import group_count, pack_int4_cols, read_gptq_spec
from specchat.quant.split_experts import split_experts

Q_STD = 4.6  # the standard deviation of q - 8 for q uniform in 0..15: scales keep a layer's outputs near unit size


def alias_config(alias: str, layers: int, shrink: dict) -> tuple[PretrainedConfig, dict | None]:
    """The alias's shipped config with `layers` decoder layers and `shrink`'s overrides, without its
    quantization settings (a model built from it is dense), and those settings (None: not GPTQ)."""
    values = json.loads(shipped_config_path(alias).read_text())
    settings = values.pop("quantization_config", None)
    values |= {"num_hidden_layers": layers, **shrink}
    return AutoConfig.for_model(**values), settings


def write_random_4bit(config: PretrainedConfig, settings: dict, directory: Path, seed: int = 0,
                      distinct: bool = True) -> Path:
    """A GPTQ or AWQ checkpoint of `config` in `directory` (written once): every decoder linear (each
    expert's too) random 4-bit weights under `settings` (the alias's quantization_config), every
    other tensor random (norms 1) in float16, as those checkpoints store them; one shard a layer.
    Not `distinct`: one draw for all the linears of a shape, for a check that only times what it
    writes (drawing is half the writing: ~1.1 s of a 70B layer's ~2.2 s on one core)."""
    if (directory / "config.json").exists():
        return directory
    random_linear = random_awq_linear if settings["quant_method"] == "awq" else random_gptq_linear
    with torch.device("meta"):  # names and shapes only
        skeleton = AutoModelForCausalLM.from_config(config)
    split_experts(skeleton, None)  # a MoE's experts as three linears each (nothing for a dense model)
    generator = torch.Generator().manual_seed(seed)
    linears = decoder_linears(skeleton)
    replaced = {f"{name}.weight" for name in linears}
    state = skeleton.state_dict()
    drawn: dict[tuple[int, int], dict[str, Tensor]] = {}  # by shape, when not `distinct`
    directory.mkdir(parents=True, exist_ok=True)
    for shard, names in enumerate(shards(state, config.num_hidden_layers)):
        tensors = {}
        for name in names:
            if name in replaced:
                linear = linears[name.removesuffix(".weight")]
                shape = (linear.in_features, linear.out_features)
                if shape in drawn:  # a copy: safetensors refuses a file in which two names share memory
                    parts = {key: tensor.clone() for key, tensor in drawn[shape].items()}
                else:
                    parts = random_linear(*shape, settings, generator)
                if not distinct:
                    drawn[shape] = parts
                tensors |= {f"{name.removesuffix('.weight')}.{key}": tensor for key, tensor in parts.items()}
            else:
                tensors[name] = random_dense(name, state[name].shape, generator)
        save_file(tensors, directory / f"model-{shard:05d}.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config.to_dict() | {"dtype": "float16",
                                                                          "quantization_config": settings}, indent=2))
    return directory


def shards(state: dict[str, Tensor], layers: int) -> list[list[str]]:
    """The state's names by shard: one per decoder layer, then the rest."""
    by_layer: list[list[str]] = [[] for _ in range(layers + 1)]
    for name in state:
        index = int(name.split(".")[2]) if name.startswith("model.layers.") else layers
        by_layer[index].append(name)
    return by_layer


def random_gptq_linear(in_features: int, out_features: int, settings: dict, generator: torch.Generator
                       ) -> dict[str, Tensor]:
    """qweight, qzeros, scales and g_idx (quant/gptq.py's v1 format) of a random 4-bit weight:
    every bit pattern of qweight is 8 valid nibbles, so random words are random weights."""
    spec = read_gptq_spec({"quantization_config": settings})
    groups = group_count(in_features, spec.group_size)
    size = in_features if spec.group_size == -1 else spec.group_size
    words = torch.randint(0, 256, (in_features // 8 * out_features * 4,), dtype=torch.uint8, generator=generator)
    zeros = torch.full((groups, out_features), 8) if spec.sym else \
        torch.randint(1, 16, (groups, out_features), generator=generator)
    scales = (0.5 + torch.rand(groups, out_features, generator=generator)) / (Q_STD * math.sqrt(in_features))
    order = torch.randperm(in_features, generator=generator) if spec.desc_act else torch.arange(in_features)
    g_idx = torch.empty(in_features, dtype=torch.int32)
    g_idx[order] = (torch.arange(in_features) // size).to(torch.int32)
    return {"qweight": words.view(torch.int32).view(in_features // 8, out_features),
            "qzeros": pack_int4_cols(zeros - 1),  # v1 stores zero - 1
            "scales": scales.to(torch.float16), "g_idx": g_idx}


def random_awq_linear(in_features: int, out_features: int, settings: dict, generator: torch.Generator
                      ) -> dict[str, Tensor]:
    """qweight [I, O/8], qzeros and scales (AutoAWQ's GEMM format, quant/awq.py) of a random 4-bit
    weight. Nibbles pack along outputs in AWQ's interleaved order, which random values need not
    follow: any 8 values in a word are 8 valid nibbles. Zeros near the grid's middle keep q - z centred."""
    size = settings["group_size"]
    groups = in_features // size
    words = torch.randint(0, 256, (in_features * out_features // 2,), dtype=torch.uint8, generator=generator)
    zeros = torch.randint(7, 10, (groups, out_features), generator=generator)
    scales = (0.5 + torch.rand(groups, out_features, generator=generator)) / (Q_STD * math.sqrt(in_features))
    return {"qweight": words.view(torch.int32).view(in_features, out_features // 8),
            "qzeros": pack_int4_cols(zeros), "scales": scales.to(torch.float16)}


def random_dense(key: str, shape: torch.Size, generator: torch.Generator) -> Tensor:
    if key.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.float16)
    return (torch.randn(shape, generator=generator) * 0.02).to(torch.float16)


def random_draft(config: PretrainedConfig, device: torch.device, seed: int = 0) -> PreTrainedModel:
    """A bf16 model of `config` with random weights, made on `device` (a GPU draws them in
    milliseconds where a CPU takes seconds at 7B widths)."""
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


def prepared_as_draft(model: PreTrainedModel, form: str, device: torch.device) -> PreTrainedModel:
    """`model` as the loader prepares a draft on `device` (models/draft.py): its attention packed
    and bounded as the app builds every model, on CUDA its projections stacked and its norms fused;
    its decoder linears in `form` (--draft-quant): none, int4 (rounded to 4 bits, in its dtype, run
    by int4_gemm's kernel at the widths its probe finds it faster) or fp8."""
    bound_attention(model)
    return approximation(DraftQuant(form), None, model.dtype, device).prepared(model).model
