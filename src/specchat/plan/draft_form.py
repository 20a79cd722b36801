"""A draft as the memory plan weighs it: one form (quantization) of it, and what that form holds where."""

from dataclasses import dataclass

from specchat.models.draft_step import StepCost
from specchat.plan.demand import ModelShape


@dataclass(frozen=True)
class Draft:
    """A draft in one quantization."""

    quant: str  # none | int8 | int4 | nf4
    weights: int  # bytes on the device
    shape: ModelShape
    load_bytes: int  # host RAM its weights pass through while they load (freed once on the device)
    prepare_bytes: int = 0  # device bytes above `weights` while it loads and turns int8 or int4, layer by layer
    dense_above: int | None = None  # int8: wider steps multiply dense copies kept beside (counted in `weights`)
    workspace: int = 0  # int4: its 4-bit products' largest temporary over a step as wide as the largest tree
    step: StepCost | None = None  # its step's cost on this machine, where measured
    # bytes of its input embedding held in host RAM beside a GPU (offload/host_embedding.py), out of `weights`
    host_embedding: int = 0

    @property
    def form(self) -> str:
        """The form in words, as notes and refusals name it."""
        return self.quant if self.dense_above is None else f"{self.quant} with dense copies for wide steps"
