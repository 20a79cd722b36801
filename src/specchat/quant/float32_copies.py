"""Float32 dense copies of a CPU's 4-bit linears, where a copy in the compute dtype never pays.

On a CPU without bf16 instructions (AVX2 alone: an AMD Zen 3, most consumer CPUs) bf16 products
are emulated and compute-bound: a bf16 dense copy multiplied slower than the fused int4 kernel at
every width, so no 4-bit linear kept one and every tree pass and prompt ran the fused kernel, whose
cost grows with the rows. oneDNN's float32 product of a prepacked weight streams at memory speed
instead: on an AVX2 AMD EPYC, a 1536 -> 8960 linear of the 1.5B at 16 / 64 / 256 rows took 6.9 /
15.9 / 52.6 ms in float32 prepacked, against 8.4 / 33.5 / 118.9 fused and 21.9 / 86.9 / 331.8 in
dense bf16 (2026-11-30). The copy holds twice the bf16 copy's bytes (4 a weight), which the plan
counts (int4_dense.copy_bytes).

From how many rows the float32 copy beats the packed products is measured once per machine and
shape and kept (machine_choices.remembered), as widths.py's choices are; `specchat doctor` lists
it and measures it again.
"""

from functools import cache

import torch
from torch import Tensor, nn

from specchat.machine_choices import Kept, measured, remembered, write_kept
from specchat.quant import timing
from specchat.quant.int4_chunks import dequantized
from specchat.quant.int4_layout import layout_for
from specchat.quant.int8 import dense_linear
from specchat.quant.prepacked_linear import PrepackedLinear
from specchat.quant.timing import LinearShape
from specchat.quant.widths import CPU, DENSE_ROWS, WIDTH_GROUP, arguments, packed_product, random_int4, width_choice

CHOICE = "int4 float32 copy rows"  # its name among the kept choices


@cache
def float32_copy_rows(in_features: int, out_features: int, dtype: torch.dtype) -> int | None:
    """The fewest input rows (of DENSE_ROWS) from which a float32 copy of this CPU weight, its
    inputs of `dtype` cast to float32 and back, multiplies faster than its packed products; None
    where it never does, or where the layout cannot be read back to make the copy."""
    if layout_for(CPU, in_features) is None:
        return None
    key = {"in_features": in_features, "out_features": out_features, "dtype": str(dtype)}
    return remembered(CHOICE, key, CPU, lambda: measure(**arguments(key)))


def measure_again(kept: Kept) -> Kept:
    """A kept crossover measured now and kept, whatever the load (`specchat doctor --measure-again`)."""
    fresh = measured(kept.choice, kept.key, CPU, lambda: measure(**arguments(kept.key)))
    write_kept(fresh)
    return fresh


def measure(in_features: int, out_features: int, dtype: torch.dtype) -> int | None:
    packed, scales_and_zeros, x = random_int4(CPU, dtype, LinearShape(in_features, out_features), WIDTH_GROUP,
                                              max(DENSE_ROWS))
    layout = layout_for(CPU, in_features)
    copy = float32_linear(dequantized(packed, scales_and_zeros, WIDTH_GROUP, layout, torch.float32))
    return timing.crossover(DENSE_ROWS, lambda rows: copy(x[:rows].float()).to(dtype), lambda rows: packed_product(
        x[:rows], packed, scales_and_zeros, WIDTH_GROUP, layout, width_choice("cpu", dtype)), CPU)


def float32_linear(weight: Tensor) -> nn.Module:
    """A float32 `weight` as oneDNN's prepacked product where this torch's oneDNN takes a float32
    weight, else a plain linear."""
    return PrepackedLinear(weight, None) if float32_prepacks() else dense_linear(weight)


@cache
def float32_prepacks() -> bool:
    """Whether oneDNN here packs a float32 weight and multiplies by it (a build without it raises)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        PrepackedLinear(torch.ones(16, 16), None)(torch.ones(1, 16))
    except RuntimeError:  # no float32 inner product in this oneDNN: the plain linear serves
        return False
    return True
