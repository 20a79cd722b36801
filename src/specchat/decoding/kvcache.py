"""KV caches whose slots are preallocated and indexed by position.

transformers' DynamicCache grows by concatenation, so every forward copies the whole cache of
every layer (at 4,000 tokens of a 28-layer, 2-KV-head, 128-dim bf16 model: ~115 MB per token).
A `SlotLayer` holds its keys and values in buffers [batch, heads, capacity, dim] grown CHUNK
slots at a time: a forward writes only its new slots, a layer is copied only when it outgrows its
capacity (once per CHUNK tokens), and pruning moves only the slots that change place.
"""

import math

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

CHUNK = 256  # slots added when a layer's buffers are full


class SlotLayer(DynamicLayer):
    """One layer's keys and values; `keys`/`values` are views of the first `length` slots."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.key_slots = key_states.new_empty((*key_states.shape[:-2], 0, key_states.shape[-1]))
        self.value_slots = value_states.new_empty((*value_states.shape[:-2], 0, value_states.shape[-1]))
        self.length = 0
        self.is_initialized = True
        self.expose()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.reserve(end)
        self.key_slots[..., self.length:end, :] = key_states
        self.value_slots[..., self.length:end, :] = value_states
        self.length = end
        self.expose()
        return self.keys, self.values

    def reserve(self, slots: int) -> None:
        """Room for `slots` slots, rounded up to a whole number of chunks; the filled part is
        copied only here."""
        if slots <= self.capacity:
            return
        capacity = math.ceil(slots / CHUNK) * CHUNK
        for name in ("key_slots", "value_slots"):
            old = getattr(self, name)
            # zeros, not garbage: a static-shape step attends over every slot, the unused ones masked,
            # and a masked NaN would still poison its row (0 * NaN)
            grown = old.new_zeros((*old.shape[:-2], capacity, old.shape[-1]))
            grown[..., :self.length, :] = old[..., :self.length, :]
            setattr(self, name, grown)

    @property
    def capacity(self) -> int:
        return self.key_slots.shape[-2]

    def expose(self) -> None:
        self.keys = self.key_slots[..., :self.length, :]
        self.values = self.value_slots[..., :self.length, :]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor, slots: torch.Tensor, span: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """`update`'s static-shape form: the new rows go to `slots` (a tensor on the device) of
        buffers reserved beforehand, and the first `span` slots come back, so no shape depends on
        the length; the caller advances the length (`advance`)."""
        self.key_slots.index_copy_(-2, slots, key_states)
        self.value_slots.index_copy_(-2, slots, value_states)
        return self.key_slots[..., :span, :], self.value_slots[..., :span, :]

    @torch.inference_mode()  # the buffers a forward made are inference tensors
    def keep(self, in_place: int, moved: torch.Tensor) -> None:
        """Keep the first `in_place` slots where they are and move the slots `moved` (ascending,
        each past them, on this layer's device) to follow them, in that order."""
        count = in_place + moved.numel()
        if moved.numel():
            # index_select gathers into a new tensor first, so overlapping source and target slots are safe
            self.key_slots[..., in_place:count, :] = self.key_slots.index_select(-2, moved)
            self.value_slots[..., in_place:count, :] = self.value_slots.index_select(-2, moved)
        self.length = count
        self.expose()

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))
        self.expose()

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' convention: a negative count of slots to drop from the end."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of slots to drop (got {tokens_to_remove})")
        if self.is_initialized:
            self.truncate(self.length + tokens_to_remove)

    def reset(self) -> None:
        if self.is_initialized:
            self.truncate(0)


class SlotCache(DynamicCache):
    """A DynamicCache (the type the models accept) whose layers are `SlotLayer`s, created as
    the first forward reaches them. While `write_slots` is set (a static-shape step,
    static_step.py), every layer writes there and returns its first `span` slots."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = SlotLayer
        self.write_slots: torch.Tensor | None = None
        self.span = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.write_slots is None:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return self.layers[layer_idx].write(key_states, value_states, self.write_slots, self.span)

    def capacity(self) -> int:
        """Slots every layer holds room for (0 before the first forward)."""
        return min((layer.capacity for layer in self.layers if layer.is_initialized), default=0)

    def reserve(self, slots: int) -> None:
        """Room for `slots` slots in every layer (buffers are then kept: a captured step reads them)."""
        for layer in self.layers:
            layer.reserve(slots)

    def advance(self, count: int) -> None:
        """Count `count` more slots as held in every layer, after a static-shape step wrote them."""
        for layer in self.layers:
            layer.length += count
            layer.expose()


def new_cache() -> SlotCache:
    """An empty cache."""
    return SlotCache()


def cache_length(cache: DynamicCache) -> int:
    """Number of token slots currently held."""
    return cache.get_seq_length()


def keep_slots(cache: SlotCache, keep: torch.Tensor) -> None:
    """Keep only the slots `keep` (ascending indices), in that order, in every layer.

    Used after verification to retain the committed prefix plus the accepted tree path: a
    node's index in the tree is its slot, so pruning moves only the accepted nodes' slots. The
    leading slots already in place (keep[i] == i: the committed prefix) stay where they are; which
    those are is worked out once, on the host, and the rest reach each device once (worked out a
    layer at a time, each layer's copy over and count read back synchronized a GPU: 224 times an
    iteration for an 80-layer target and a 32-layer draft).
    """
    keep = keep.cpu()
    in_place = int((keep == torch.arange(keep.numel())).cumprod(0).sum()) if keep.numel() else 0
    moved: dict[torch.device, torch.Tensor] = {}
    for layer in cache.layers:
        if layer.is_initialized:
            if layer.device not in moved:
                moved[layer.device] = keep[in_place:].to(layer.device)
            layer.keep(in_place, moved[layer.device])


def truncate(cache: SlotCache, length: int) -> None:
    """Drop every slot at or after `length`, layer by layer: after a forward interrupted
    between layers (a preempted DSI job) the layers hold different lengths."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.truncate(length)
