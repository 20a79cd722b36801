"""KV cache helpers: a transformers DynamicCache whose slots are indexed by position."""

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """An empty cache that grows by concatenation along the sequence axis."""
    return DynamicCache()


def cache_length(cache: DynamicCache) -> int:
    """Number of token slots currently held."""
    return cache.get_seq_length()


def keep_slots(cache: DynamicCache, keep: torch.Tensor) -> None:
    """Keep only the slots `keep` (ascending indices), in that order, in every layer.

    Used after verification to retain the committed prefix plus the accepted tree path: a
    node's index in the tree is its slot, so pruning is one index_select per layer.
    """
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        index = keep.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop every slot at or after `length`, layer by layer: after a forward interrupted
    between layers (a preempted DSI job) the layers hold different lengths."""
    for layer in cache.layers:
        if layer.is_initialized and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]
