"""What `--offload auto` would do with the default target on this machine: the placement made as
the loader makes it (before loading anything), under the same budgets."""

from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig, Qwen2Config

from specchat.errors import SpecchatError
from specchat.limits import auto_cap
from specchat.models.embedded import EMBEDDED, converted_path
from specchat.models.marker import is_converted
from specchat.models.registry import DEFAULT_TARGET
from specchat.offload.build import OffloadPlan, plan_model
from specchat.offload.placement import Placement
from specchat.offload.sources import SafetensorsSource

# The default target (Qwen2.5-Coder-1.5B-Instruct) as converted: used until the converted
# directory exists, so that doctor never assembles or converts.
DEFAULT_TARGET_CONFIG = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
)


def default_target_config() -> tuple[PretrainedConfig, SafetensorsSource | None]:
    directory = converted_path(EMBEDDED[DEFAULT_TARGET])
    if is_converted(directory):
        return AutoConfig.from_pretrained(directory), SafetensorsSource(directory)
    return Qwen2Config(**DEFAULT_TARGET_CONFIG), None


def plan_default_target(offload_dir: Path, ram_budget: int | None, vram_budget: int | None) -> Placement | str:
    """The placement of the default target in bfloat16, or the one-line reason it fits nowhere."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = OffloadPlan(tier="auto", offload_dir=offload_dir, ram_budget=ram_budget, vram_budget=vram_budget,
                       tree_tokens=auto_cap(cuda=device.type == "cuda", offloaded=True))
    config, source = default_target_config()
    try:
        return plan_model(config, source, DEFAULT_TARGET, torch.bfloat16, device, plan)
    except SpecchatError as error:
        return str(error)
