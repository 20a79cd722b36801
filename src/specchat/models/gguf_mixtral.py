"""Mixtral from a GGUF file, which llama.cpp writes under the architecture `llama`.

Such a file declares `llama.expert_count` and `llama.expert_used_count`, stores each layer's router
as `blk.N.ffn_gate_inp` [E, H] and its experts stacked: `ffn_gate_exps` and `ffn_up_exps` [E, I, H],
`ffn_down_exps` [E, H, I] (gguf.GGUFReader's order), I being `feed_forward_length` (llama.cpp builds
a llama's experts that wide). transformers 5 reads it as a dense Llama and initializes its MLPs at
random; its GGUF loader cannot load it as a Mixtral either (gguf's tensor maps know no `mixtral`).
So the model is transformers' MixtralForCausalLM, built here from its own pieces:
  the config: its reading of the llama fields, with the expert counts;
  the names: gguf's llama tensor map (ffn_gate_inp -> mlp.gate, ffn_down_exps ->
    mlp.experts.down_proj, the rest as a Llama's), Qwen2MoeTensorProcessor's fallback mapping
    ffn_gate_exps and ffn_up_exps to the fused mlp.experts.gate_up_proj;
  the weights: each tensor dequantized by gguf, then processed as transformers processes a llama
    file (LlamaTensorProcessor un-permutes the q and k rows llama.cpp permuted for its rope) or a
    Qwen2-MoE one (Qwen2MoeTensorProcessor fuses gate_up_proj[e] = cat(gate[e], up[e]) by rows).
Files of old llama.cpp, one tensor per expert (`blk.N.ffn_gate.E.weight`), are refused in one line.
"""

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, dequantize
from torch import Tensor
from transformers import MixtralConfig, MixtralForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import GGUFTensor, LlamaTensorProcessor, Qwen2MoeTensorProcessor, \
    get_gguf_hf_weights_map

from specchat.errors import SpecchatError

PER_EXPERT = re.compile(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight")
# the reading's own identity, not carried: the MixtralConfig states its own
IDENTITY = ("model_type", "architectures", "transformers_version")


def is_mixtral(reader: GGUFReader) -> bool:
    """Whether the file is llama.cpp's Mixtral: a `llama` whose metadata counts experts."""
    count = reader.fields.get("llama.expert_count")
    return str(reader.fields["general.architecture"].contents()) == "llama" and count is not None \
        and int(count.contents()) > 0


def mixtral_config(name: str, reader: GGUFReader, llama: PretrainedConfig) -> MixtralConfig:
    """transformers' reading of the file's llama fields (`llama`: widths, heads, rope, norm eps,
    tokens) as a MixtralConfig, with the file's expert counts; an expert is feed_forward_length wide."""
    check_stacked(name, reader)
    fields = MixtralConfig().to_dict().keys()
    carried = {key: value for key, value in llama.to_dict().items() if key in fields and key not in IDENTITY}
    return MixtralConfig(**carried, num_local_experts=count(name, reader, "llama.expert_count"),
                         num_experts_per_tok=count(name, reader, "llama.expert_used_count"))


def count(name: str, reader: GGUFReader, key: str) -> int:
    field = reader.fields.get(key)
    if field is None:
        raise SpecchatError(f"{name} counts Mixtral experts but declares no {key}")
    return int(field.contents())


def check_stacked(name: str, reader: GGUFReader) -> None:
    """One line for a Mixtral file of old llama.cpp, its experts stored one tensor each."""
    apart = next((tensor.name for tensor in reader.tensors if PER_EXPERT.fullmatch(tensor.name)), None)
    if apart is not None:
        raise SpecchatError(f"{name} stores its Mixtral experts one tensor each ({apart}), as llama.cpp wrote them "
                            "before stacking them (ffn_gate_exps): convert the model again with a current llama.cpp")


class MixtralTensorProcessor(Qwen2MoeTensorProcessor):
    """Qwen2-MoE's processor for the stacked experts (and their names), Llama's for the rest."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config=config)
        self.llama = LlamaTensorProcessor(config=config)

    def process(self, weights: np.ndarray, name: str, **kwargs: Any) -> GGUFTensor:
        if self.GGUF_MOE_WEIGHTS_PATTERN.fullmatch(name):
            return super().process(weights, name, **kwargs)
        return self.llama.process(weights, name, **kwargs)


def mixtral_names(model: PreTrainedModel) -> dict[str, str]:
    """GGUF tensor name -> `model`'s state_dict name (the stacked experts' with no `.weight`)."""
    return get_gguf_hf_weights_map(model, MixtralTensorProcessor(model.config.to_dict()), model_type="llama")


def mixtral_state_dict(path: Path, config: MixtralConfig, dtype: torch.dtype) -> dict[str, Tensor]:
    """Every tensor of the file under the model's name, dequantized and processed (see above), in
    `dtype`; one line for a tensor a Mixtral has no place for, or of another shape, or one missing."""
    model = meta_model(config)
    expected, names = model.state_dict(), mixtral_names(model)
    processor, parsed = MixtralTensorProcessor(config.to_dict()), {"tensors": {}}
    for tensor in GGUFReader(path).tensors:
        if tensor.name not in names and tensor.name.removesuffix(".weight") not in names:
            raise SpecchatError(f"{path.name} holds {tensor.name}, which a Mixtral has no place for")
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters=parsed)
        if result.name is not None:  # the stacked experts are put in place by the processor itself
            parsed["tensors"][names[result.name]] = torch.from_numpy(np.copy(result.weights)).to(dtype)
    tensors = {key: value.to(dtype) for key, value in parsed["tensors"].items()}
    check_complete(path.name, tensors, expected, config)
    return tensors


def meta_model(config: MixtralConfig) -> MixtralForCausalLM:
    """The model's shapes and names, no memory."""
    with torch.device("meta"):
        return MixtralForCausalLM(config)


def check_complete(name: str, tensors: dict[str, Tensor], expected: dict[str, Tensor], config: MixtralConfig) -> None:
    """One line unless `tensors` fill every parameter of `expected` (a tied LM head is the
    embedding's) with its shape."""
    for key, value in expected.items():
        if key not in tensors and not (key == "lm_head.weight" and config.tie_word_embeddings):
            raise SpecchatError(f"{name} holds no tensor for the Mixtral's {key}")
        if key in tensors and tensors[key].shape != value.shape:
            raise SpecchatError(f"{name} gives the Mixtral's {key} the shape {tuple(tensors[key].shape)}, where its "
                                f"metadata makes it {tuple(value.shape)}")
