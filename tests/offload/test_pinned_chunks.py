"""The pinned RAM tier in a few power-of-two buffers (offload/pinned_chunks.py): every layer whole,
aligned and apart in its buffer, fewer bytes than a buffer a layer, and the RAM store's layers
are views of exactly those buffers, written and read back."""

import pytest
import torch

from specchat.checkpoint.layout import lay_out
from specchat.offload.direct_io import ALIGN, align_up
from specchat.offload.pinned_chunks import CHUNK_CAP, chunked, pinned_blobs, pinned_bytes, pinned_tier_bytes
from specchat.offload.storage import RamStore

LAYER_70B_AWQ = 454_590_464  # a Llama-3.1-70B-AWQ layer's bytes, as its layout lays them out
LAYER_235B = 1_322_405_888  # a Qwen3-235B-A22B-GPTQ layer's
GIB = 2**30


@pytest.mark.parametrize("sizes", [[LAYER_70B_AWQ] * count for count in (1, 2, 3, 9, 10, 38, 42, 44)]
                         + [[LAYER_235B] * 59, [5 * CHUNK_CAP], [100, 5000, 70_000, 3 * ALIGN] * 3])
def test_every_layer_lies_whole_aligned_and_apart_in_a_power_of_two_buffer(sizes):
    chunks = chunked(sizes)
    assert sum(len(offsets) for _, offsets in chunks) == len(sizes)
    index = 0
    for capacity, offsets in chunks:
        assert capacity == pinned_bytes(capacity)
        end = 0
        for offset in offsets:
            assert offset % ALIGN == 0 and offset >= end  # in order, apart
            end = offset + align_up(sizes[index])
            index += 1
        assert end + ALIGN <= capacity  # the ALIGN bytes that align the buffer's start are kept
    assert pinned_tier_bytes(sizes) == sum(capacity for capacity, _ in chunks)


def test_it_takes_fewer_bytes_than_a_buffer_a_layer():
    # nine 0.455 GB layers fill a 4 GiB buffer (4.09 GB of 4.29); 38 = 4 x 9 + 2, the two in 1 GiB
    assert pinned_tier_bytes([LAYER_70B_AWQ] * 38) == 4 * 4 * GIB + GIB  # 18.25 GB; 20.40 GB a buffer each
    # three 1.32 GB layers a 4 GiB buffer: 60 in 20 of them (a buffer each: 2 GiB, 120 GiB in all)
    assert pinned_tier_bytes([LAYER_235B] * 60) == 20 * 4 * GIB
    # the last ones: 59 = 19 x 3 + 2, the two in a 4 GiB buffer (as many bytes as 2 GiB each)
    assert pinned_tier_bytes([LAYER_235B] * 59) == 20 * 4 * GIB


def test_the_ram_stores_layers_are_views_of_those_buffers_and_read_back_what_was_written():
    specs = [("w", torch.float32, (3, 300)), ("b", torch.int64, (7,))]
    layout = lay_out(specs)
    layouts = {layer: layout for layer in (4, 5, 6)}
    blobs = pinned_blobs(layouts)
    assert list(blobs) == [4, 5, 6] and all(blob.numel() == align_up(layout.nbytes) for blob in blobs.values())
    assert all(blob.data_ptr() % ALIGN == 0 for blob in blobs.values())
    assert len({blob.untyped_storage().data_ptr() for blob in blobs.values()}) == len(chunked([layout.nbytes] * 3))
    store = RamStore(layouts, pin=True)
    written = {layer: {"w": torch.full((3, 300), float(layer)), "b": torch.arange(7) * layer} for layer in layouts}
    for layer, tensors in written.items():
        store.write(layer, tensors)
    for layer, tensors in written.items():
        views = layout.views(store.read(layer, torch.empty(0, dtype=torch.uint8)))
        assert all(torch.equal(views[name], tensors[name]) for name in tensors)
