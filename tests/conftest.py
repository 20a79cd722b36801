"""Shared fixtures: tiny random models built in-process (fast, deterministic)."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specchat.decoding.forward import CausalLM


def build_tiny(seed: int, vocab: int = 50, dtype: torch.dtype = torch.float64, sharpness: float = 8.0) -> CausalLM:
    """A 2-layer Qwen2 with random weights; `sharpness` scales the LM head so that
    next-token distributions are peaked enough for drafts to be accepted."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return CausalLM(model)


@pytest.fixture(scope="session")
def tiny_target() -> CausalLM:
    return build_tiny(0)


@pytest.fixture(scope="session")
def tiny_draft() -> CausalLM:
    return build_tiny(1)
