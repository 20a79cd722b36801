"""A decoder layer whose weights are bound, for each call, to the ring slot that holds them."""

from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from specchat.offload.layout import LayerLayout
from specchat.offload.streamer import Streamer


class StreamedLayer(nn.Module):
    """Stands in the model's layer list for the real layer, which stays on the meta device.

    It is an ordinary list element, so the model may iterate, slice or index its layers as it
    likes; each call asks the streamer for this layer's slot, runs the model's own layer code on
    views of that slot (torch.func.functional_call), and gives the slot back.
    """

    def __init__(self, skeleton: nn.Module, index: int, layout: LayerLayout, streamer: Streamer,
                 slots: list[torch.Tensor]) -> None:
        super().__init__()
        # Not registered as a submodule: its meta tensors must not count as the model's weights.
        object.__setattr__(self, "skeleton", skeleton)
        self.index = index  # in the model's layer list
        self.layout = layout
        self.streamer = streamer
        self.slots = slots

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        slot = self.streamer.acquire(self.index)
        try:
            weights = self.layout.views(self.slots[slot])
            return functional_call(self.skeleton, weights, args, kwargs, tie_weights=False, strict=True)
        finally:
            self.streamer.release(slot)

    def __getattr__(self, name: str) -> Any:
        # Model code sometimes reads a layer attribute (e.g. its attention type): forward it.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "skeleton"), name)
