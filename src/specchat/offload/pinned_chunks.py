"""The pinned RAM tier laid out in a few large buffers instead of one a layer.

CUDA's pinned (caching host) allocator rounds every allocation up to a power of two, so one
buffer a layer pins 512 MiB for a 0.455 GB 70B-AWQ layer (18% more than it holds) and 2 GiB for a
1.32 GB Qwen3-235B layer (62% more). Layers laid end to end in buffers that are powers of two
themselves lose only what their last layers leave unfilled (`chunked`: buffers of CHUNK_CAP, then
powers of two for the layers left, chosen for the fewest bytes). The plan counts the tier as
`chunked` lays it out (plan/placement.py) and the RAM store allocates it so (offload/storage.py):
the same layers, the same bytes.
"""

import torch

from specchat.checkpoint.layout import LayerLayout
from specchat.cuda_device import cuda_usable
from specchat.offload.direct_io import ALIGN, align_up

CHUNK_CAP = 1 << 32  # 4 GiB: a buffer this large wastes under 5% for a 70B layer, and pins in one call


def pinned_bytes(nbytes: int) -> int:
    """What CUDA's caching host allocator takes for one buffer of `nbytes` pinned: the next power
    of two."""
    return 1 << max(nbytes - 1, 0).bit_length()


def chunked(sizes: list[int] | tuple[int, ...]) -> list[tuple[int, list[int]]]:
    """The buffers for layers of `sizes`, in order: each buffer's bytes and its layers' offsets in
    it. ALIGN bytes of a buffer are kept so that its first layer can start on an ALIGN boundary
    wherever the allocator puts it; each layer takes align_up(size), so every offset stays aligned.
    Past CHUNK_CAP bytes a buffer of CHUNK_CAP takes the layers that fit; below it, the layers left
    go whole into the smallest power of two that holds them, or into the largest one they fill and
    the buffers after, whichever takes fewer bytes."""
    if not sizes:
        return []
    spans = [align_up(size) for size in sizes]
    left = sum(spans) + ALIGN
    whole = pinned_bytes(left)
    own = pinned_bytes(spans[0] + ALIGN)  # the first layer's buffer when no larger one is asked for
    if whole > max(CHUNK_CAP, own):
        first, count = filling(spans, max(CHUNK_CAP, own))
        return [(max(CHUNK_CAP, own), first), *chunked(sizes[count:])]
    filled = max(pinned_bytes(left + 1) // 2, own)  # the largest power of two within `left`
    first, count = filling(spans, filled)
    rest = chunked(sizes[count:])
    if count == len(sizes) or whole <= filled + sum(capacity for capacity, _ in rest):
        return [(whole, filling(spans, whole)[0])]
    return [(filled, first), *rest]


def filling(spans: list[int], capacity: int) -> tuple[list[int], int]:
    """The offsets of the first layers of `spans` that fit in `capacity` (less ALIGN), and how many."""
    offsets, used = [], ALIGN
    for span in spans:
        if used + span > capacity:
            break
        offsets.append(used - ALIGN)
        used += span
    return offsets, len(offsets)


def pinned_tier_bytes(sizes: list[int] | tuple[int, ...]) -> int:
    """The pinned bytes `chunked`'s buffers take for layers of `sizes`."""
    return sum(capacity for capacity, _ in chunked(sizes))


def pinned_blobs(layouts: dict[int, LayerLayout]) -> dict[int, torch.Tensor]:
    """Each layer's aligned buffer, a view of the few pinned buffers `chunked` lays the layers out
    in (in order); pinned where a GPU runs the models, as aligned_empty pins."""
    layers = list(layouts)
    blobs, index = {}, 0
    for capacity, offsets in chunked([layouts[layer].nbytes for layer in layers]):
        base = torch.empty(capacity, dtype=torch.uint8, pin_memory=cuda_usable())
        shift = -base.data_ptr() % ALIGN  # within the ALIGN bytes chunked keeps
        for offset in offsets:
            start = shift + offset
            blobs[layers[index]] = base[start:start + align_up(layouts[layers[index]].nbytes)]
            index += 1
    return blobs
