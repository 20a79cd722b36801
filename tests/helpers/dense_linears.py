"""The small dense models the CPU product choices are tested on (quant/widened.py,
quant/onednn_float.py): a seeded random linear, a tiny Qwen2 with a tied head, and its logits."""

import torch
from helpers.tiny import tiny_qwen_config
from torch import nn
from transformers import Qwen2ForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache


def random_linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias, dtype=dtype).requires_grad_(False)
    linear.weight.copy_(torch.randn(out_features, in_features, generator=generator))
    if bias:
        linear.bias.copy_(torch.randn(out_features, generator=generator))
    return linear


def tied_tiny_model(dtype: torch.dtype) -> Qwen2ForCausalLM:
    """2 layers of 7 linears each and a head tied to the input embedding."""
    torch.manual_seed(0)
    config = tiny_qwen_config(vocab_size=256, hidden_size=64, intermediate_size=128, max_position_embeddings=64,
                              tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(dtype).eval().requires_grad_(False)


def prompt_logits(model) -> torch.Tensor:
    """The logits of a 6-token prompt's pass."""
    lm, prompt = CausalLM(model), torch.tensor([5, 17, 3, 88, 42, 7])
    return lm.logits(lm.hidden(prompt, torch.arange(6), new_cache()))
