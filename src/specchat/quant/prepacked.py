"""Dense linears on a CPU with their weights prepacked, once, in the blocked layout oneDNN's inner
product reads.

nn.Linear hands oneDNN a plain [out, in] weight on every call. Prepacked, the same bytes stream
faster at the widths decoding runs: on the project's machine (2 cores with avx512_bf16), one row
through the 1.5B's LM head took 11 ms against 15.5 ms, through an 8960 -> 1536 down_proj 0.32 ms
against 0.81 ms, and a one-token pass of the packed target 50 ms against 60. The outputs were
bitwise F.linear's at every width measured there (1 to 257 rows). Whether it pays is measured
once per machine (`prepack_pays`); where oneDNN has no kernel for the dtype,
nn.Linear stays.

The prepacked weight is an opaque oneDNN tensor: same bytes as the plain one (`nbytes`), no data
pointer. Repacking allocates the packed copy beside the plain one, which is freed after it, so a
weight is repacked only where the plan leaves that room (`prepack_linears`' `room`).
"""

from collections import Counter
from functools import cache

import torch
from torch import Tensor, nn

from specchat.machine_choices import remembered
from specchat.quant import timing
from specchat.quant.timing import LinearShape

PREPACKED_DTYPES = (torch.bfloat16,)  # oneDNN's inner product takes a packed float32 weight only through MKL
PROBE_SHAPE = LinearShape(8192, 4096)  # 64 MB in bf16, past the caches, as a decoder's weights are
PROBE_ROWS = (1, 64)  # a token, and a tree pass
CPU = torch.device("cpu")


class PrepackedLinear(nn.Module):
    """y = x W^T + b with W [out, in] prepacked for oneDNN (buffer `packed_weight`)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed_weight", prepack(weight))
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "PrepackedLinear":
        return cls(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def forward(self, x: Tensor) -> Tensor:
        # contiguous: F.linear's own results are those of a contiguous input (a strided one takes
        # another path and other bits)
        flat = x.reshape(-1, self.in_features).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked for oneDNN"


def prepack(weight: Tensor) -> Tensor:
    """`weight` [out, in] in oneDNN's blocked layout for its inner product (batch size hint 1: decoding)."""
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight, 1)


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


@cache
def prepack_pays(dtype: torch.dtype) -> bool:
    """Whether a prepacked product of `dtype` is no slower than F.linear at every PROBE_ROWS width
    on this CPU (quant.timing: the fastest of a few runs each, in turns); False where oneDNN has
    no kernel for it. Measured once per machine (~0.1 s) and kept (machine_choices.py): measured
    at every startup it flipped (here: pays in 1 of 5 runs), and the cost probe's key with it."""
    if dtype not in PREPACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    return remembered(f"prepacked products pay, {dtype}", CPU, lambda: measure_prepack_pays(dtype))


def measure_prepack_pays(dtype: torch.dtype) -> bool:
    weight = torch.ones(PROBE_SHAPE.out_features, PROBE_SHAPE.in_features, dtype=dtype)
    x = torch.ones(max(PROBE_ROWS), PROBE_SHAPE.in_features, dtype=dtype)
    try:
        linear = PrepackedLinear(weight, None)
        linear(x[:1])
    except RuntimeError:  # this oneDNN has no inner product for `dtype` on this CPU: nothing to pack
        return False
    return not any(timing.faster(lambda: nn.functional.linear(x[:rows], weight), lambda: linear(x[:rows]), CPU)
                   for rows in PROBE_ROWS)
