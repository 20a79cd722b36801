"""transformers' model of a GGUF file, every tensor dequantized.

transformers' GGUF loader reads most files itself, given the config models/gguf_config.py reads (the
experts' widths it leaves out); a Mixtral (architecture `llama`), which it cannot map, is built
from the state dict models/gguf_mixtral.py reads, by the same from_pretrained.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedModel

from specchat.models.gguf_config import gguf_config
from specchat.models.gguf_mixtral import mixtral_state_dict


def gguf_model(path: Path, dtype: torch.dtype, **options: Any) -> PreTrainedModel:
    """The model of the GGUF file at `path` in `dtype`; `options` go to from_pretrained."""
    config = gguf_config(path)
    if isinstance(config, MixtralConfig):  # transformers reads no GGUF as a Mixtral: it is llama.cpp's
        tensors = mixtral_state_dict(path, config, dtype)
        return MixtralForCausalLM.from_pretrained(None, config=config, state_dict=tensors, dtype=dtype, **options)
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config, dtype=dtype, **options)
