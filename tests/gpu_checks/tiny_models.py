"""Random checkpoints written on the fly for the GPU check: small Llama and Qwen2 models of 8
decoder layers, a GPTQ copy of one, and a wide model whose layers are large enough (134 MB in
bfloat16) for copy bandwidth and device compute to dominate per-layer overheads."""

from pathlib import Path

import torch
from helpers.gptq_writer import write_gptq_checkpoint
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config

from specchat.quant.gptq import GPTQSpec

LAYERS = 8
FAMILIES = {"llama": LlamaConfig, "qwen2": Qwen2Config}
GPTQ_SPEC = GPTQSpec(group_size=16, desc_act=True, sym=False)  # the format's hardest case: act-order, zeros


def small_config(family: str) -> PretrainedConfig:
    return FAMILIES[family](
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )


def wide_config() -> PretrainedConfig:
    # A layer: 4 x 2048^2 attention + 3 x 2048 x 8192 MLP weights = 67.1 M, 134 MB in bfloat16.
    return LlamaConfig(
        vocab_size=1024, hidden_size=2048, intermediate_size=8192, num_hidden_layers=LAYERS, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=2048, tie_word_embeddings=False,
    )


def random_model(config: PretrainedConfig, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def saved(config: PretrainedConfig, directory: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A random model of `config` saved as safetensors in `directory` (written once)."""
    if not (directory / "config.json").exists():
        random_model(config).to(dtype).save_pretrained(directory)
    return directory


def small_checkpoint(family: str, workdir: Path) -> Path:
    return saved(small_config(family), workdir / f"small-{family}")


def wide_checkpoint(workdir: Path) -> Path:
    return saved(wide_config(), workdir / "wide", torch.bfloat16)


def gptq_checkpoint(workdir: Path) -> Path:
    """The small Qwen2 model, its decoder linears 4-bit GPTQ (round to nearest; the format is GPTQ's)."""
    directory = workdir / "small-qwen2-gptq"
    if not (directory / "config.json").exists():
        write_gptq_checkpoint(random_model(small_config("qwen2")), directory, GPTQ_SPEC)
    return directory
