"""What of a model is already on this machine: its safetensors directory (dense or 4-bit) and
its tokenizer, found without fetching or converting anything."""

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from specchat.models.configs import config_from_file
from specchat.models.embedded import EMBEDDED, converted_path, int4_path
from specchat.models.spec import ModelSource, resolve
from specchat.models.marker import is_converted, is_current_int4


def local_tokenizer(spec: str, weights: str = "dense") -> PreTrainedTokenizerBase | None:
    """The tokenizer of `spec` when its safetensors directory is already here, loaded before the
    memory plan so that what the plan measures the process holding includes it (Qwen2.5's takes
    0.13 GB); None when the model is still to be fetched or converted (it loads with the weights)."""
    source = resolve(spec)
    if source.kind == "dir":  # one line for a config the tokenizer's loader would fail on with a traceback
        config_from_file(Path(source.location) / "config.json")
    directory = local_safetensors(source, weights)
    return None if directory is None else AutoTokenizer.from_pretrained(directory)


def local_safetensors(source: ModelSource, weights: str = "dense") -> Path | None:
    """The directory of `source`'s safetensors (its 4-bit ones when `weights` is quantized: --weights
    as decided) when they are already here, else None."""
    if source.kind == "dir" and any(Path(source.location).glob("*.safetensors")):
        return Path(source.location)
    if source.kind == "embedded":
        model = EMBEDDED[source.location]
        quantized = weights == "quantized"
        directory = int4_path(model) if quantized else converted_path(model)
        return directory if (is_current_int4 if quantized else is_converted)(directory) else None
    return None
