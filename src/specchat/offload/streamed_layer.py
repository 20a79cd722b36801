"""A decoder layer whose weights are bound, for each call, to the ring slot that holds them."""

from typing import Any

import torch
from torch import nn

from specchat.checkpoint.layout import LayerLayout
from specchat.offload.expert_cache import ExpertCache
from specchat.offload.experts import ExpertLoads, SlotExperts, split_experts_of
from specchat.offload.streamer import Streamer
from specchat.quant.split_experts import Resident


class StreamedLayer(nn.Module):
    """Stands in the model's layer list for the real layer, whose own tensors stay on the meta
    device.

    It is an ordinary list element, so the model may iterate, slice or index its layers as it
    likes; each call asks the streamer for this layer's slot, points the layer's tensors at views
    of that slot and runs the model's own layer code, then gives the slot back. The views of a
    slot are made once and kept, so rebinding is a dozen dictionary writes (it used
    torch.func.functional_call, which re-parametrizes the module and rebuilds the views on every
    call).

    Streamed by expert (`held` given, and the layout has expert units), the layer's experts are
    fetched as its router picks them (offload/experts.py), from `cache` where it holds them; a
    call that routed to nearly all of them has the ring loads it starts move whole layers.
    """

    def __init__(self, skeleton: nn.Module, index: int, layout: LayerLayout, streamer: Streamer,
                 slots: list[torch.Tensor], held: SlotExperts | None = None, cache: ExpertCache | None = None) -> None:
        super().__init__()
        # Not registered as a submodule: its meta tensors must not count as the model's weights.
        object.__setattr__(self, "skeleton", skeleton)
        self.index = index  # in the model's layer list
        self.layout = layout
        self.streamer = streamer
        self.slots = slots
        self.owners = [owner_of(skeleton, place.name) for place in layout.places]
        self.views: dict[int, list[torch.Tensor]] = {}  # per slot: the layer's tensors in it
        self.held = held if layout.units else None
        self.experts = split_experts_of(skeleton) if self.held is not None else None
        self.cache = cache

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        slot, loads = self.streamer.acquire(self.index), None
        try:
            self.bind(slot)
            if self.experts is not None:
                whole = len(self.layout.units) if self.streamer.arrived_whole.get(slot) else 0
                loads = ExpertLoads(self.streamer, self.index, slot, self.slots[slot], self.layout.units,
                                    self.held.enter(slot, self.index, whole), self.cache)
                self.experts.feed = loads
            return self.skeleton(*args, **kwargs)
        finally:
            if self.experts is not None:
                # the ring load this release starts is a later layer's in this pass (or the next
                # pass's first): routed as widely as this one, most likely
                self.streamer.whole = loads is not None and self.held.loads_whole(loads.routed, len(self.layout.units))
                self.experts.feed = Resident()
            self.streamer.release(slot)

    def bind(self, slot: int) -> None:
        """Point every tensor of the layer at its place in `slot`."""
        if slot not in self.views:
            self.views[slot] = list(self.layout.views(self.slots[slot]).values())
        for (table, name), view in zip(self.owners, self.views[slot]):
            table[name] = view

    def __getattr__(self, name: str) -> Any:
        # Model code sometimes reads a layer attribute (e.g. its attention type): forward it.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "skeleton"), name)


def owner_of(module: nn.Module, dotted: str) -> tuple[dict, str]:
    """The parameter or buffer table of the submodule holding `dotted` (a state_dict name), and
    the name in it."""
    path, _, name = dotted.rpartition(".")
    owner = module.get_submodule(path)
    if name in owner._parameters:
        return owner._parameters, name
    if name in owner._buffers:
        return owner._buffers, name
    raise KeyError(f"{dotted} is neither a parameter nor a buffer of the layer")


def computing_modules(model: nn.Module) -> list[nn.Module]:
    """`model`'s modules and those of its streamed layers' skeletons (which are not its submodules):
    every module a pass runs."""
    modules = list(model.modules())
    return modules + [inner for m in modules if isinstance(m, StreamedLayer) for inner in m.skeleton.modules()]
