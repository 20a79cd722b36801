"""The model walks that pick a CPU model's dense products: prepacked for oneDNN (quant/prepacked_linear.py)
where that pays on this machine (quant/widths.py's `prepack_pays`) and the plan leaves the room;
the half-precision linears left plain, and the Q6_K ones, widened to float32 from the rows where
that pays (quant/widened.py).
"""

from collections import Counter
from collections.abc import Iterable

import torch
from torch import nn

from specchat.quant.prepacked_linear import PREPACKED_DTYPES, PrepackedLinear
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.widened import widen, widened_rows, widens
from specchat.quant.widths import prepack_pays


def prepackable(module: nn.Module, shared: set[int]) -> bool:
    """A plain nn.Linear on a CPU in a prepacked dtype whose weight no other module holds (a tied
    LM head keeps its plain layout: the embedding reads the same tensor)."""
    return (type(module) is nn.Linear and module.weight.device.type == "cpu"
            and module.weight.dtype in PREPACKED_DTYPES and module.weight.data_ptr() not in shared)


def prepack_linears(model: nn.Module, room: int | None = None) -> int:
    """Replace `model`'s prepackable linears by PrepackedLinears where `prepack_pays` for their dtype,
    those whose weight fits in `room` bytes (None: any); returns how many were replaced."""
    holders = Counter(p.data_ptr() for _, p in model.named_parameters(remove_duplicate=False) if p.device.type == "cpu")
    shared = {pointer for pointer, count in holders.items() if count > 1}
    replaced = 0
    for name, module in list(model.named_modules()):
        if not prepackable(module, shared) or not prepack_pays(module.weight.dtype):
            continue
        if room is not None and module.weight.nbytes > room:
            continue
        model.set_submodule(name, PrepackedLinear.from_linear(module))
        replaced += 1
    return replaced


def widen_linears(modules: Iterable[nn.Module], device: torch.device, dtype: torch.dtype) -> int:
    """Make the plain half-precision linears of `modules` (a model's, its streamed layers' too)
    WidenedLinears, and their Q6Linears multiply inputs of `dtype` in float32 from as many rows,
    where they compute on a CPU and this CPU widens that dtype (weights streamed in later are
    widened too: only the modules change); returns how many."""
    if device.type != "cpu":
        return 0
    widened = 0
    for module in modules:
        if widens(module) and (rows := widened_rows(module.weight.dtype)) is not None:
            widen(module, rows)
            widened += 1
        elif isinstance(module, Q6Linear) and (rows := widened_rows(dtype)) is not None:
            module.widened_from = rows
            widened += 1
    return widened
