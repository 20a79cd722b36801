"""What a model built on the meta device will need, in bytes: its layers, the parts outside them,
and the headroom its KV caches and largest tree take (the input of `placement.place`)."""

import torch
from torch import nn
from transformers import PreTrainedModel

from specchat.offload.direct_io import align_up
from specchat.offload.layout import LayerLayout
from specchat.offload.placement import ModelSizes


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """One cache slot: keys and values of every layer."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * dtype.itemsize


def tree_activation_bytes(config, dtype: torch.dtype, context_tokens: int, tree_tokens: int) -> int:
    """One target pass over a tree of `tree_tokens` after a full context, one layer at a time:
    the attention scores (heads x n x (context + n)) as a math-path attention holds them, the
    tree mask (additive and boolean), the MLP's three n x intermediate products and a few n x
    hidden states: an upper bound, as fused kernels hold less."""
    n, keys = tree_tokens, context_tokens + tree_tokens
    scores = config.num_attention_heads * n * keys * dtype.itemsize
    masks = n * keys * (dtype.itemsize + 1)
    mlp = 3 * n * config.intermediate_size * dtype.itemsize
    hidden = 4 * n * config.hidden_size * dtype.itemsize
    return scores + masks + mlp + hidden


def measure_sizes(model: PreTrainedModel, layers_name: str, layouts: list[LayerLayout], dtype: torch.dtype,
                  context_tokens: int, tree_tokens: int) -> ModelSizes:
    """`model` on the meta device; both KV caches are counted as the target's (a draft is smaller)."""
    outside = sum(tensor_bytes(t, dtype) for name, t in unique_tensors(model)
                  if not name.startswith(layers_name + "."))
    config = model.config
    headroom = 2 * kv_bytes_per_token(config, dtype) * context_tokens + \
        tree_activation_bytes(config, dtype, context_tokens, tree_tokens)
    layers = tuple(layout.nbytes for layout in layouts)
    return ModelSizes(layers, outside, headroom, sum(align_up(size) for size in layers))


def unique_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers, a tied weight counted once."""
    seen, out = set(), []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append((name, tensor))
    return out


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype) -> int:
    """Floating tensors load in `dtype`; others (GPTQ's packed words) keep theirs."""
    itemsize = dtype.itemsize if tensor.is_floating_point() else tensor.dtype.itemsize
    return tensor.numel() * itemsize
