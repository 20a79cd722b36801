"""Tiny random Qwen2 models built in-process (fast, deterministic), the drafts made from them by
perturbing their weights, and the Models bundle that holds a pair of them."""

from collections.abc import Callable, Iterable

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from specchat.decoding.autosize import Costs
from specchat.decoding.forward import CausalLM
from specchat.runtime import Models

# The suite's smallest Qwen2: 2 layers, GQA (4 query heads over 2 KV heads); the rest is Qwen2Config's.
TINY_QWEN = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)


class TinyCharTokenizer:
    """One token per character (its code point modulo 50), like the tiny models' vocabulary."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(char) % 50 for char in text]}


def tiny_qwen_config(**overrides: object) -> Qwen2Config:
    """TINY_QWEN with `overrides` (sizes, tying, context...): one place that spells a Qwen2 config."""
    return Qwen2Config(**{**TINY_QWEN, **overrides})


def build_tiny(seed: int, vocab: int = 50, dtype: torch.dtype = torch.float64, sharpness: float = 8.0) -> CausalLM:
    """A 2-layer Qwen2 with random weights; `sharpness` scales the LM head so that
    next-token distributions are peaked enough for drafts to be accepted."""
    torch.manual_seed(seed)
    config = tiny_qwen_config(vocab_size=vocab, max_position_embeddings=1024, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return CausalLM(model)


def add_noise(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], scale: float,
              draw: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Each (destination, source): the source plus `scale` of its spread times a draw of noise."""
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.copy_(theirs + scale * draw(theirs) * theirs.std())


def perturbed(model: CausalLM, scale: float, seed: int) -> CausalLM:
    """A copy of `model` with Gaussian noise on every weight: a draft that mostly agrees."""
    torch.manual_seed(seed)
    copy = type(model.model)(model.model.config).to(model.dtype).eval()
    add_noise(zip(copy.parameters(), model.model.parameters()), scale, torch.randn_like)
    return CausalLM(copy)


def perturbed_in_place(model: PreTrainedModel) -> PreTrainedModel:
    """A draft that mostly agrees with its target: the target's own float weights, each perturbed in
    place by noise of a fifth of its parameter's spread (seeded), so that some drafted tokens are
    accepted and some are not."""
    generator = torch.Generator().manual_seed(3)
    parameters = list(model.parameters())
    add_noise(zip(parameters, parameters), 0.2, lambda like: torch.randn(like.shape, generator=generator))
    return model


def tiny_models(target: CausalLM | None, draft: CausalLM | None, tokenizer: object = None,
                costs: Costs | None = None, workers: object = None) -> Models:
    """A Models bundle of tiny models on the CPU, as a run would load it (1024 tokens of room)."""
    return Models(tokenizer=tokenizer, stop_ids=frozenset(), device=torch.device("cpu"), context=1024,
                  target=target, draft=draft, costs=costs, workers=workers)
