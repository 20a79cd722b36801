"""One contiguous byte buffer per decoder layer: where each of the layer's tensors sits in it.

A layer then moves in one copy (one disk read, one host->device transfer), and its tensors are
views of whatever buffer currently holds it. Any dtype fits, packed int4 (int32 words) included.
"""

from dataclasses import dataclass

import torch

# Every tensor starts on a 64-byte boundary: a multiple of every element size, and of a cache line.
_TENSOR_ALIGN = 64


@dataclass(frozen=True)
class TensorPlace:
    name: str  # as in the layer's state_dict
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the layer buffer

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize


@dataclass(frozen=True)
class LayerLayout:
    places: tuple[TensorPlace, ...]
    nbytes: int  # bytes used, the last tensor's end

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's tensors as views of `buffer` (uint8, at least nbytes long, any device)."""
        return {
            p.name: buffer[p.offset:p.offset + p.nbytes].view(p.dtype).view(p.shape) for p in self.places
        }


def lay_out(specs: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> LayerLayout:
    """Place tensors (name, dtype, shape) one after another, each on an aligned offset."""
    places, offset = [], 0
    for name, dtype, shape in specs:
        offset = -(-offset // _TENSOR_ALIGN) * _TENSOR_ALIGN
        place = TensorPlace(name, dtype, tuple(shape), offset)
        places.append(place)
        offset += place.nbytes
    return LayerLayout(tuple(places), offset)


def pack_into(layout: LayerLayout, tensors: dict[str, torch.Tensor], buffer: torch.Tensor) -> None:
    """Copy `tensors` (cast to the layout's dtypes) into their places in `buffer`."""
    views = layout.views(buffer)
    missing = set(views) - set(tensors)
    if missing:
        raise KeyError(f"tensors missing from the layer: {sorted(missing)}")
    for name, view in views.items():
        view.copy_(tensors[name].reshape(view.shape))
