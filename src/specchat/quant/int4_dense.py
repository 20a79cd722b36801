"""Dense copies of a CPU's 4-bit linears for wide inputs: a tree pass at the dense matmul's speed.

torch's fused int4 kernel on a CPU expands every weight again for every few input rows, so its cost
grows with the rows far faster than a dense matmul's: on a Xeon with AMX, a 1536 -> 8960 linear took
0.55 ms at one row against 1.61 dense, but 14.0 ms at 64 rows against 3.14 (issue 36's table). A
tree of tens of tokens then costs several one-token passes and --budget auto keeps trees small. Where
the plan has the room (an in-memory target; `keep_dense_copies`' `room`), each Int4Linear keeps a
dense copy of its weight in the compute dtype beside the packed one, and inputs wider than the
crossover measured at its own shape multiply the copy (`copy_choice`); one token keeps the fused
kernel. Where a copy in the compute dtype never beats the fused kernel (quant/widths.py's
`dense_rows`: a CPU without bf16 instructions, whose bf16 products are emulated), the copy is kept
in float32 where that does (quant/float32_copies.py): wide inputs are cast to float32 and the
product back, at twice the bytes.

The copy is the packed weight expanded once, w = (q - 8) * scale + zero in float32 (bitwise the
fused kernel's weights, int4_chunks), and rounded once to the compute dtype (a float32 copy holds
them exactly). A row of a tree pass is therefore not the bits of the same row in a one-token pass:
the rounded weights move a bf16 logit by a few hundredths at most (docs/exactness.md), a float32
copy's product only rounds differently, and tree-versus-sequential comparisons follow the bf16
near-tie rule. The copy is held as a plain attribute, not a buffer: state_dict, layer files and
streamed bytes stay the packed form alone.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.quant.float32_copies import float32_copy_rows, float32_linear
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_chunks import dequantized
from specchat.quant.int4_expand import expand_int4, triton_available
from specchat.quant.int4_layout import layout_for
from specchat.quant.int8 import dense_linear
from specchat.quant.widths import dense_copy_linear, dense_rows


@dataclass(frozen=True)
class CopyChoice:
    """A copy in `dtype` multiplies inputs of at least `from_rows` rows."""

    from_rows: int
    dtype: torch.dtype


@dataclass(frozen=True)
class DenseCopy:
    """What an Int4Linear multiplies inputs of at least `from_rows` rows with (bias not included)."""

    linear: nn.Module  # an nn.Linear, or its PrepackedLinear where oneDNN's prepacked product pays
    from_rows: int
    dtype: torch.dtype  # the copy's: inputs are cast to it, the product back to theirs

    def __call__(self, flat: Tensor) -> Tensor:
        return self.linear(flat.to(self.dtype)).to(flat.dtype)


def copy_choice(in_features: int, out_features: int, dtype: torch.dtype) -> CopyChoice | None:
    """The copy a 4-bit linear of this shape and compute dtype keeps on this CPU: in `dtype` from
    the rows where that beats the packed products; where it never does, in float32 from the rows
    where that does; None where neither pays."""
    rows = dense_rows(in_features, out_features, dtype)
    if rows is not None:
        return CopyChoice(rows, dtype)
    rows = None if dtype == torch.float32 else float32_copy_rows(in_features, out_features, dtype)
    return None if rows is None else CopyChoice(rows, torch.float32)


def expand(linear: Int4Linear, dtype: torch.dtype | None = None) -> Tensor:
    """The linear's weight [O, I] over its (permuted) inputs in `dtype` (its compute dtype unless
    given): on CUDA by the expansion kernel wide passes run there (quant/int4_expand.py), else in
    float32 chunks of torch ops; both compute (q - 8) * scale + zero in float32 and round it once."""
    dtype = dtype or linear.compute_dtype
    layout = layout_for(linear.packed.device, linear.in_features)
    if layout is None:
        # dense_rows rules such a layout out before any copy is asked for
        raise SpecchatError("this torch's int4 layout cannot be read back: no dense copy")
    if linear.packed.device.type == "cuda" and triton_available():
        return expand_int4(linear.packed, linear.scales_and_zeros, linear.group_size, layout, dtype)
    return dequantized(linear.packed, linear.scales_and_zeros, linear.group_size, layout, dtype)


def dense_copy_bytes(model: nn.Module) -> int:
    """What `keep_dense_copies` would add for every Int4Linear of `model` (on any device, a
    skeleton's included) whose shape gains from a copy on this CPU."""
    return sum(copy_bytes(linear, choice) for linear, choice in gaining(model))


def keep_dense_copies(model: nn.Module, room: int) -> int:
    """Give the Int4Linears of `model` on a CPU whose shape gains from it a dense copy, in the
    model's order, while the copies fit in `room` bytes; returns the bytes kept."""
    kept = 0
    for linear, choice in gaining(model):
        if linear.packed.device.type != "cpu" or kept + copy_bytes(linear, choice) > room:
            continue
        linear.dense = DenseCopy(copy_linear(expand(linear, choice.dtype)), choice.from_rows, choice.dtype)
        kept += copy_bytes(linear, choice)
    return kept


def copy_linear(weight: Tensor) -> nn.Module:
    """The copy's product: float32 through float32_copies' (what its crossover was timed with)."""
    return float32_linear(weight) if weight.dtype == torch.float32 else dense_copy_linear(weight)


def gaining(model: nn.Module) -> list[tuple[Int4Linear, CopyChoice]]:
    linears = [m for m in model.modules() if isinstance(m, Int4Linear)]
    return [(m, choice) for m in linears if (choice := copy_choice(*shape_of(m))) is not None]


def shape_of(linear: Int4Linear) -> tuple[int, int, torch.dtype]:
    return linear.in_features, linear.out_features, linear.compute_dtype


def copy_bytes(linear: Int4Linear, choice: CopyChoice) -> int:
    return linear.in_features * linear.out_features * choice.dtype.itemsize


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
