"""A draft's RMS norms as torch's rms_norm (models/fused_norms.py): the norms it takes are exactly
transformers' Llama norm, it computes what they compute (rounded once where they round twice),
and a model with its norms fused computes what it did."""

import importlib
import inspect

import pytest
import torch
from helpers.tiny import build_tiny
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specchat.models.fused_norms import LLAMA_NORMS, FusedRMSNorm, fuse_norms

MODULES = {"LlamaRMSNorm": "llama", "Qwen2RMSNorm": "qwen2", "Qwen3RMSNorm": "qwen3", "MistralRMSNorm": "mistral",
           "MixtralRMSNorm": "mixtral", "Qwen2MoeRMSNorm": "qwen2_moe", "Qwen3MoeRMSNorm": "qwen3_moe",
           "Phi3RMSNorm": "phi3"}


@pytest.mark.parametrize("name", sorted(LLAMA_NORMS))
def test_every_norm_it_replaces_is_llamas(name):
    module = importlib.import_module(f"transformers.models.{MODULES[name]}.modeling_{MODULES[name]}")
    assert inspect.getsource(getattr(module, name).forward) == inspect.getsource(LlamaRMSNorm.forward)


def norm_and_input(dtype: torch.dtype) -> tuple[LlamaRMSNorm, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(512, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(512, generator=generator))
    return norm.to(dtype), (3 * torch.randn(64, 512, generator=generator)).to(dtype)


def test_in_float32_it_is_the_norm_bit_for_bit():
    norm, x = norm_and_input(torch.float32)
    assert torch.equal(FusedRMSNorm(norm)(x), norm(x))


def test_in_bfloat16_it_is_within_a_rounding_of_the_norm():
    """transformers rounds the normalized states to bf16 before the weight multiplies them; the fused
    norm rounds once: at most 1 bf16 step of the result apart (1.0, measured here on the AMD EPYC,
    2026-11-28; the bound is 2)."""
    norm, x = norm_and_input(torch.bfloat16)
    reference, fused = norm(x).float(), FusedRMSNorm(norm)(x)
    assert fused.dtype == torch.bfloat16
    steps = (fused.float() - reference).abs() / (reference.abs() * torch.finfo(torch.bfloat16).eps)
    assert steps.max() <= 2


def test_a_fused_model_computes_what_it_did():
    lm = build_tiny(0, dtype=torch.float32)
    tokens = torch.arange(12)[None] % 50
    before = lm.model(tokens).logits
    layers = lm.model.config.num_hidden_layers
    assert fuse_norms(lm.model) == 2 * layers + 1  # two a layer, and the final norm
    assert fuse_norms(lm.model) == 0  # none left to fuse
    assert isinstance(lm.model.model.norm, FusedRMSNorm)
    assert torch.equal(lm.model(tokens).logits, before)  # float32: each norm bit for bit, above
