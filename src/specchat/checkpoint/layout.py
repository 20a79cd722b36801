"""One contiguous byte buffer per decoder layer: where each of the layer's tensors sits in it.

A layer then moves in one copy (one disk read, one host->device transfer), and its tensors are
views of whatever buffer currently holds it. Any dtype fits, packed int4 (int32 words) included.

A MoE layer is laid out as its head (attention, norms, router, shared expert) followed by one unit
per expert, each unit's tensors together and starting on a direct-I/O boundary: streamed by
expert, the head moves ahead with the layer and a unit only once the router picks its expert, each
in one aligned read that cannot spill into the next unit.
"""

from dataclasses import dataclass

import torch
from torch import nn

from specchat.alignment import ALIGN
from specchat.quant.split_experts import SplitExperts

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
    units: tuple[tuple[int, int], ...] = ()  # (start, end) bytes of expert e's unit, e = 0 .. E-1

    @property
    def head(self) -> int:
        """Bytes of the part that moves with the layer whatever its tokens route to: all of it
        unless it has expert units, which follow the head."""
        return self.units[0][0] if self.units else self.nbytes

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's tensors as views of `buffer` (uint8, at least nbytes long, any device)."""
        return {
            p.name: buffer[p.offset:p.offset + p.nbytes].view(p.dtype).view(p.shape) for p in self.places
        }


Spec = tuple[str, torch.dtype, tuple[int, ...]]


def lay_out(specs: list[Spec], unit_of: dict[str, int] | None = None) -> LayerLayout:
    """Place tensors (name, dtype, shape) one after another, each on an aligned offset; those that
    `unit_of` gives an expert (0 .. E-1, every one at least a tensor) after the others, expert by
    expert, each expert's unit starting on an ALIGN boundary."""
    unit_of = unit_of or {}
    # one pass over the specs, not one per unit (a 128-expert layer holds ~1500 tensors, so that was
    # ~200,000 comparisons a layer); group 0 holds the tensors of no unit, group u + 1 unit u's
    groups: list[list[Spec]] = [[] for _ in range(len(set(unit_of.values())) + 1)]
    for spec in specs:
        groups[unit_of.get(spec[0], -1) + 1].append(spec)
    places, units, offset = [], [], 0
    for number, group in enumerate(groups):
        if number:  # an expert's unit
            offset = align(offset, ALIGN)
            start = offset
        for name, dtype, shape in group:
            offset = align(offset, _TENSOR_ALIGN)
            place = TensorPlace(name, dtype, tuple(shape), offset)
            places.append(place)
            offset += place.nbytes
        if number:
            units.append((start, offset))
    return LayerLayout(tuple(places), offset, tuple(units))


def layout_of(layer: nn.Module) -> LayerLayout:
    """The layer's tensors in one buffer, a MoE layer's experts each in a unit of its own."""
    return lay_out([(name, t.dtype, tuple(t.shape)) for name, t in layer.state_dict().items()], expert_units(layer))


def expert_units(layer: nn.Module) -> dict[str, int]:
    """The state_dict names of `layer`'s per-expert tensors, each with its expert."""
    units = {}
    for prefix, module in layer.named_modules():
        if isinstance(module, SplitExperts):
            units |= {f"{prefix}.{name}": int(name.split(".")[0]) for name in module.state_dict()}
    return units


def align(offset: int, boundary: int) -> int:
    return -(-offset // boundary) * boundary


def pack_into(layout: LayerLayout, tensors: dict[str, torch.Tensor], buffer: torch.Tensor) -> None:
    """Copy `tensors` (cast to the layout's dtypes) into their places in `buffer`."""
    views = layout.views(buffer)
    missing = set(views) - set(tensors)
    if missing:
        raise KeyError(f"tensors missing from the layer: {sorted(missing)}")
    for name, view in views.items():
        view.copy_(tensors[name].reshape(view.shape))
