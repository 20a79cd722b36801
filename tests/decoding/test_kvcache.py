"""KV caches of preallocated slots (a transformers DynamicCache whose layers are SlotLayers)."""

import pytest
import torch
from transformers import DynamicCache

from specchat.decoding.kvcache import CHUNK, SlotLayer, cache_length, keep_slots, new_cache, truncate

LAYERS = 2
SHAPE = (1, 2, 7, 4)  # batch, kv heads, slots, head dim


def filled_cache(slots: int = SHAPE[2]) -> tuple[DynamicCache, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A cache with distinct random keys/values per layer and the tensors put in it."""
    generator = torch.Generator().manual_seed(0)
    cache = new_cache()
    originals = []
    for layer in range(LAYERS):
        shape = (*SHAPE[:2], slots, SHAPE[3])
        keys, values = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        cache.update(keys, values, layer)
        originals.append((keys, values))
    return cache, originals


def test_new_cache_is_empty() -> None:
    cache = new_cache()
    assert isinstance(cache, DynamicCache)  # what the models accept
    assert cache_length(cache) == 0


def test_slots_grow_a_chunk_at_a_time_and_are_written_in_place() -> None:
    cache, originals = filled_cache()
    layer = cache.layers[0]
    assert isinstance(layer, SlotLayer) and layer.capacity == CHUNK
    buffer = layer.key_slots.data_ptr()
    for _ in range(CHUNK - 7):  # one token per forward up to a full chunk: no new buffer
        cache.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4), 0)
    assert layer.key_slots.data_ptr() == buffer and layer.get_seq_length() == CHUNK
    assert layer.keys.data_ptr() == buffer  # the keys a forward sees are a view, not a copy
    cache.update(torch.full((1, 2, 1, 4), 3.0), torch.ones(1, 2, 1, 4), 0)
    assert layer.capacity == 2 * CHUNK and layer.key_slots.data_ptr() != buffer
    assert torch.equal(layer.keys[:, :, :7], originals[0][0]) and torch.equal(layer.keys[:, :, -1:], torch.full((1, 2, 1, 4), 3.0))


def test_a_static_write_goes_to_its_slots_and_returns_the_first_span_of_the_buffers() -> None:
    cache, originals = filled_cache()
    cache.write_slots, cache.span = torch.tensor([7, 8]), 16
    keys, values = cache.update(torch.full((1, 2, 2, 4), 5.0), torch.full((1, 2, 2, 4), 6.0), 1)
    layer = cache.layers[1]
    assert keys.shape == values.shape == (1, 2, 16, 4) and keys.data_ptr() == layer.key_slots.data_ptr()  # views
    assert torch.equal(keys[:, :, :7], originals[1][0]) and torch.equal(keys[:, :, 7:9], torch.full((1, 2, 2, 4), 5.0))
    assert torch.equal(values[:, :, 7:9], torch.full((1, 2, 2, 4), 6.0))
    assert layer.get_seq_length() == 7  # the caller advances the length


def test_keep_moves_only_the_slots_after_the_prefix_in_place() -> None:
    cache, originals = filled_cache()
    layer = cache.layers[1]
    prefix_before = layer.key_slots[:, :, :3].clone()
    buffer = layer.key_slots.data_ptr()
    keep_slots(cache, torch.tensor([0, 1, 2, 5, 6]))
    assert layer.key_slots.data_ptr() == buffer  # pruned inside the same buffer
    assert torch.equal(layer.key_slots[:, :, :3], prefix_before)
    assert torch.equal(layer.keys, originals[1][0][:, :, [0, 1, 2, 5, 6]])


def test_a_truncated_cache_overwrites_its_old_slots() -> None:
    cache, originals = filled_cache()
    truncate(cache, 3)
    new_keys = torch.full((1, 2, 2, 4), 9.0)
    for layer in range(LAYERS):
        cache.update(new_keys, new_keys, layer)
    assert cache_length(cache) == 5
    assert torch.equal(cache.layers[0].keys, torch.cat([originals[0][0][:, :, :3], new_keys], dim=2))


def test_crop_drops_slots_from_the_end_as_transformers_does() -> None:
    cache, originals = filled_cache()
    cache.crop(-2)
    assert cache_length(cache) == 5
    assert torch.equal(cache.layers[0].values, originals[0][1][:, :, :5])
    cache.crop(0)  # nothing to drop: transformers' own crop takes 0 too
    assert cache_length(cache) == 5
    with pytest.raises(ValueError, match="crop takes a negative count of slots to drop"):
        cache.crop(1)


def test_cache_length_counts_slots_across_updates() -> None:
    cache, _ = filled_cache()
    assert cache_length(cache) == 7
    for layer in range(LAYERS):
        cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), layer)
    assert cache_length(cache) == 10


def test_keep_slots_keeps_selected_slices_in_every_layer() -> None:
    cache, originals = filled_cache()
    keep = torch.tensor([0, 1, 2, 4, 6])  # a prefix plus a non-contiguous accepted path
    keep_slots(cache, keep)
    assert cache_length(cache) == 5
    for layer, (keys, values) in zip(cache.layers, originals):
        assert torch.equal(layer.keys, keys[:, :, keep])
        assert torch.equal(layer.values, values[:, :, keep])


def test_keep_slots_then_update_appends_after_kept_slots() -> None:
    cache, originals = filled_cache()
    keep_slots(cache, torch.tensor([0, 3]))
    new_keys, new_values = torch.ones(1, 2, 1, 4), torch.full((1, 2, 1, 4), 2.0)
    for layer in range(LAYERS):
        cache.update(new_keys, new_values, layer)
    assert cache_length(cache) == 3
    keys, values = originals[1]
    assert torch.equal(cache.layers[1].keys, torch.cat([keys[:, :, [0, 3]], new_keys], dim=2))
    assert torch.equal(cache.layers[1].values, torch.cat([values[:, :, [0, 3]], new_values], dim=2))


def test_keep_all_slots_is_identity_and_keep_none_empties() -> None:
    cache, originals = filled_cache()
    keep_slots(cache, torch.arange(7))
    for layer, (keys, values) in zip(cache.layers, originals):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    keep_slots(cache, torch.tensor([], dtype=torch.long))
    assert cache_length(cache) == 0


def test_keep_slots_on_empty_cache_is_a_no_op() -> None:
    cache = new_cache()
    keep_slots(cache, torch.tensor([0, 1]))
    assert cache_length(cache) == 0


def test_truncate_drops_trailing_slots() -> None:
    cache, originals = filled_cache()
    truncate(cache, 4)
    assert cache_length(cache) == 4
    for layer, (keys, values) in zip(cache.layers, originals):
        assert torch.equal(layer.keys, keys[:, :, :4])
        assert torch.equal(layer.values, values[:, :, :4])


def test_truncate_to_current_or_longer_length_changes_nothing() -> None:
    cache, originals = filled_cache()
    truncate(cache, 7)
    truncate(cache, 50)
    assert cache_length(cache) == 7
    assert torch.equal(cache.layers[0].keys, originals[0][0])


def test_truncate_to_zero_empties() -> None:
    cache, _ = filled_cache()
    truncate(cache, 0)
    assert cache_length(cache) == 0


def test_truncate_uneven_layers_cuts_each_to_at_most_length() -> None:
    """After a forward preempted between layers, layer 0 holds more slots than layer 1."""
    cache, originals = filled_cache()
    extra_keys, extra_values = torch.ones(1, 2, 3, 4), torch.full((1, 2, 3, 4), 2.0)
    cache.update(extra_keys, extra_values, 0)  # layer 0 ran 3 more tokens, layer 1 did not
    assert [layer.keys.shape[-2] for layer in cache.layers] == [10, 7]
    truncate(cache, 8)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [8, 7]
    assert [layer.values.shape[-2] for layer in cache.layers] == [8, 7]
    assert torch.equal(cache.layers[0].keys, torch.cat([originals[0][0], extra_keys[:, :, :1]], dim=2))
    assert torch.equal(cache.layers[1].keys, originals[1][0])  # never grown back
    truncate(cache, 7)
    for layer, (keys, values) in zip(cache.layers, originals):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    truncate(cache, 2)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [2, 2]


def test_truncate_skips_layers_never_written() -> None:
    cache = new_cache()
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 0)
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 2)  # layer 1 left uninitialized
    assert [layer.is_initialized for layer in cache.layers] == [True, False, True]
    truncate(cache, 3)
    assert cache.layers[0].keys.shape[-2] == cache.layers[2].keys.shape[-2] == 3
    assert not cache.layers[1].is_initialized


def test_a_reset_cache_holds_no_slots_and_a_new_one_no_room() -> None:
    assert new_cache().capacity() == 0  # no layer yet: no slot reserved
    cache, _ = filled_cache()
    assert cache.capacity() == CHUNK
    cache.reset()
    assert cache_length(cache) == 0 and all(layer.keys.shape[-2] == 0 for layer in cache.layers)


def test_pruning_moves_only_the_slots_past_those_in_place(monkeypatch) -> None:
    """The committed prefix (keep[i] == i) stays where it is: each layer copies the accepted
    branch's slots alone, not the prefix onto itself (which would give the same cache, slower)."""
    cache, _ = filled_cache()
    kept = []
    keep_layer = SlotLayer.keep

    def recorded(layer: SlotLayer, in_place: int, moved: torch.Tensor) -> None:
        kept.append((in_place, moved.tolist()))
        keep_layer(layer, in_place, moved)

    monkeypatch.setattr(SlotLayer, "keep", recorded)
    keep_slots(cache, torch.tensor([0, 1, 2, 5, 6]))
    assert kept == [(3, [5, 6])] * LAYERS
