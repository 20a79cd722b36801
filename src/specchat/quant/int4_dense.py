"""Dense copies of a CPU's 4-bit linears for wide inputs: a tree pass at the dense matmul's speed.

torch's fused int4 kernel on a CPU expands every weight again for every few input rows, so its cost
grows with the rows far faster than a dense matmul's: on a Xeon with AMX, a 1536 -> 8960 linear took
0.55 ms at one row against 1.61 dense, but 14.0 ms at 64 rows against 3.14 (issue 36's table). A
tree of tens of tokens then costs several one-token passes and --budget auto keeps trees small. Where
the plan has the room (an in-memory target; `keep_dense_copies`' `room`), each Int4Linear keeps a
dense copy of its weight in the compute dtype beside the packed one, and inputs wider than the
crossover measured at its own shape (quant/widths.py's `dense_rows`) multiply the copy; one token
keeps the fused kernel.

The copy is the packed weight expanded once, w = (q - 8) * scale + zero in float32 (bitwise the
fused kernel's weights, int4_chunks) and rounded once to the compute dtype. A row of a tree pass is
therefore not the bits of the same row in a one-token pass: the rounded weights move a bf16 logit by
a few hundredths at most (docs/exactness.md), and tree-versus-sequential comparisons follow the
bf16 near-tie rule. The copy is held as a plain attribute, not a buffer: state_dict, layer files and
streamed bytes stay the packed form alone.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_chunks import dequantized
from specchat.quant.int4_expand import expand_int4
from specchat.quant.int4_layout import layout_for
from specchat.quant.int8 import dense_linear
from specchat.quant.widths import dense_copy_linear, dense_rows
from specchat.triton_support import triton_available


@dataclass(frozen=True)
class DenseCopy:
    """What an Int4Linear multiplies inputs of at least `from_rows` rows with (bias not included)."""

    linear: nn.Module  # an nn.Linear, or its PrepackedLinear where oneDNN's prepacked product pays
    from_rows: int


def expand(linear: Int4Linear) -> Tensor:
    """The linear's weight [O, I] over its (permuted) inputs in its compute dtype: on CUDA by the
    expansion kernel wide passes run there (quant/int4_expand.py), else in float32 chunks of torch
    ops; both compute (q - 8) * scale + zero in float32 and round it once to the compute dtype."""
    layout = layout_for(linear.packed.device, linear.in_features)
    if layout is None:
        # dense_rows rules such a layout out before any copy is asked for
        raise SpecchatError("this torch's int4 layout cannot be read back: no dense copy")
    if linear.packed.device.type == "cuda" and triton_available():
        return expand_int4(linear.packed, linear.scales_and_zeros, linear.group_size, layout, linear.compute_dtype)
    return dequantized(linear.packed, linear.scales_and_zeros, linear.group_size, layout, linear.compute_dtype)


def dense_copy_bytes(model: nn.Module) -> int:
    """What `keep_dense_copies` would add for every Int4Linear of `model` (on any device, a
    skeleton's included) whose shape gains from a copy on this CPU."""
    return sum(copy_bytes(linear) for linear in gaining(model))


def keep_dense_copies(model: nn.Module, room: int) -> int:
    """Give the Int4Linears of `model` on a CPU whose shape gains from it a dense copy, in the
    model's order, while the copies fit in `room` bytes; returns the bytes kept."""
    kept = 0
    for linear in gaining(model):
        if linear.packed.device.type != "cpu" or kept + copy_bytes(linear) > room:
            continue
        linear.dense = DenseCopy(dense_copy_linear(expand(linear)), dense_rows(*shape_of(linear)))
        kept += copy_bytes(linear)
    return kept


def gaining(model: nn.Module) -> list[Int4Linear]:
    return [m for m in model.modules() if isinstance(m, Int4Linear) and dense_rows(*shape_of(m)) is not None]


def shape_of(linear: Int4Linear) -> tuple[int, int, torch.dtype]:
    return linear.in_features, linear.out_features, linear.compute_dtype


def copy_bytes(linear: Int4Linear) -> int:
    return linear.in_features * linear.out_features * linear.compute_dtype.itemsize


def expand_linears(module: nn.Module) -> int:
    """Replace every Int4Linear inside `module` by an nn.Linear of its weight expanded (`expand`),
    its inputs back in the layer's order where the weight's were permuted (act order); how many.
    A draft stored in 4 bits and loaded dense (--draft-quant dense) takes its layers so: a dense
    product at every width, for 4x the bytes."""
    found = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if isinstance(child, Int4Linear)]
    for parent, name, child in found:
        weight = expand(child)
        if child.perm is not None:  # column i of the packed weight is the layer's input perm[i]
            weight = torch.empty_like(weight).index_copy_(1, child.perm, weight)
        setattr(parent, name, dense_linear(weight, None if child.bias is None else child.bias.detach()))
    return len(found)
