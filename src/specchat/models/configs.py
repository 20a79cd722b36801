"""A model's config without its weights: what a memory plan needs before anything is downloaded.

Aliases and the embedded pair read the config.json shipped in `configs/` (offline); a local
directory its own config.json; a .gguf file its metadata; a hub id only its config.json.
"""

import json
from pathlib import Path

from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig

from specchat.errors import SpecchatError
from specchat.models.gguf_config import gguf_config
from specchat.models.hub import download_config
from specchat.models.spec import ModelSource, resolve

CONFIGS = Path(__file__).resolve().parent / "configs"


def shipped_config_path(alias: str) -> Path:
    return CONFIGS / f"{alias}.json"


def read_config(spec: str) -> PretrainedConfig:
    """The config of `spec`, reading no weights (a hub id downloads its config.json only)."""
    return config_of(resolve(spec))


def config_of(source: ModelSource) -> PretrainedConfig:
    if source.kind in ("embedded", "hub") and shipped_config_path(source.name).is_file():
        return config_from_file(shipped_config_path(source.name))
    if source.kind == "dir":
        return config_from_file(Path(source.location) / "config.json")
    if source.kind == "gguf":
        return gguf_config(Path(source.location))
    if source.kind == "hub":
        return config_from_file(download_config(source.location))
    raise SpecchatError(f"{source.name} has no config to plan from")


def config_from_file(path: Path) -> PretrainedConfig:
    """A config.json as transformers reads it, its quantization_config (GPTQ, AWQ) kept."""
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # ValueError: JSON's errors, and bytes that are not UTF-8
        raise SpecchatError(f"cannot read the model config {path}: {error}") from None
    if not isinstance(values, dict):
        raise SpecchatError(f"{path} is not a transformers config: its JSON is not an object")
    if "model_type" not in values:
        raise SpecchatError(f"{path} names no model_type, so it is not a transformers config")
    if values["model_type"] not in CONFIG_MAPPING:  # only the repository's own code could build it
        raise SpecchatError(f"{path} names the model type '{values['model_type']}', which transformers does not know: "
                            "specchat never runs a repository's own model code")
    return AutoConfig.for_model(**values)
