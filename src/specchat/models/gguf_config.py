"""A GGUF file's config as transformers' GGUF loader reads it, with the MoE widths it leaves out.

transformers 5 maps a qwen2moe or qwen3moe file's `feed_forward_length` to intermediate_size, but
neither `expert_feed_forward_length` (one expert's width: moe_intermediate_size) nor qwen2moe's
`expert_shared_feed_forward_length` (shared_expert_intermediate_size): it would build the experts
at its config class's defaults (Qwen3-MoE's 768 is Qwen3-30B-A3B's width, Qwen2-MoE's 1408 and 5632
are Qwen1.5-MoE-A2.7B's), and a file of other widths then fails to load. They are read here from
the file, and the model is built with them.

llama.cpp writes Mixtral under the architecture `llama`, its experts stacked as `ffn_gate_exps`,
`ffn_up_exps` and `ffn_down_exps`; transformers reads such a file as a dense Llama whose MLPs it
initializes at random (they are "missing" from the file). Its config here is a MixtralConfig of
transformers' llama fields and the file's expert counts, and its weights are read by
models/gguf_mixtral.py (models/gguf_model.py loads either kind). Any other file storing stacked
experts under an architecture that transformers reads without them is refused in one line.
"""

import re
from pathlib import Path

from gguf import GGUFReader
from transformers import AutoConfig, PretrainedConfig

from specchat.errors import SpecchatError
from specchat.models.gguf_mixtral import is_mixtral, mixtral_config

# config attribute -> the GGUF key (after "<architecture>.") that llama.cpp writes it under
MOE_WIDTHS = {"moe_intermediate_size": "expert_feed_forward_length",
              "shared_expert_intermediate_size": "expert_shared_feed_forward_length"}
STACKED_EXPERTS = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.")
EXPERT_COUNTS = ("num_experts", "num_local_experts")  # the config attributes of transformers' MoE models


def read_gguf(path: Path) -> GGUFReader:
    """`path`'s reader; one line for a file that is not GGUF (gguf's reader fails on its first
    field with ValueError or IndexError, and an empty file cannot be mapped)."""
    try:
        return GGUFReader(path)
    except (ValueError, IndexError) as error:
        raise SpecchatError(f"{path.name} is not a readable GGUF file: {error}") from None


def gguf_config(path: Path) -> PretrainedConfig:
    """The config transformers builds `path`'s model from (pass it to from_pretrained with the file):
    its own reading of the metadata, with the experts' widths the file declares; one line for a
    file whose experts transformers would not load."""
    reader = read_gguf(path)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if is_mixtral(reader):
        return mixtral_config(path.name, reader, config)
    architecture = str(reader.fields["general.architecture"].contents())
    check_experts_load(path.name, reader, config, architecture)
    for attribute, key in MOE_WIDTHS.items():
        field = reader.fields.get(f"{architecture}.{key}")
        if field is not None and hasattr(config, attribute):
            setattr(config, attribute, int(field.contents()))
    return config


def check_experts_load(name: str, reader: GGUFReader, config: PretrainedConfig, architecture: str) -> None:
    """One line when the file stores stacked experts but transformers builds a model without any."""
    stacked = next((tensor.name for tensor in reader.tensors if STACKED_EXPERTS.search(tensor.name)), None)
    if stacked is not None and not any(hasattr(config, count) for count in EXPERT_COUNTS):
        raise SpecchatError(f"{name} stores MoE experts ({stacked}) under the architecture '{architecture}', which "
                            f"transformers' GGUF loader reads as a dense {config.model_type} without them: use the "
                            "model's safetensors, GPTQ or AWQ checkpoint")
