"""Dense copies of a CPU's 4-bit linears for wide inputs: a tree pass at the dense matmul's speed.

torch's fused int4 kernel on a CPU expands every weight again for every few input rows, so its cost
grows with the rows far faster than a dense matmul's: on a Xeon with AMX, a 1536 -> 8960 linear took
0.55 ms at one row against 1.61 dense, but 14.0 ms at 64 rows against 3.14 (issue 36's table). A
tree of tens of tokens then costs several one-token passes and --budget auto keeps trees small. Where
the plan has the room (an in-memory target; `keep_dense_copies`' `room`), each Int4Linear keeps a
dense copy of its weight in the compute dtype beside the packed one, and inputs wider than the
crossover measured at its own shape (`dense_rows`) multiply the copy; one token keeps the fused kernel.

The copy is the packed weight expanded once, w = (q - 8) * scale + zero in float32 (bitwise the
fused kernel's weights, int4_chunks) and rounded once to the compute dtype. A row of a tree pass is
therefore not the bits of the same row in a one-token pass: the rounded weights move a bf16 logit by
a few hundredths at most (docs/exactness.md), and tree-versus-sequential comparisons follow the
bf16 near-tie rule. The copy is held as a plain attribute, not a buffer: state_dict, layer files and
streamed bytes stay the packed form alone.
"""

from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.machine_choices import remembered
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_chunks import chunk_buffers, chunk_rows, dequantize_chunk
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import pack
from specchat.quant.prepacked import PrepackedLinear, prepack_pays
from specchat.quant.timing import crossover

PROBE_ROWS = (2, 4, 8, 16, 32, 64)  # tree widths at which the copy may start to win (one row: the fused kernel's)
PROBE_GROUP = 32  # GGUF Q4_K's groups: the slowest fused kernel, so the crossover it gives is the earliest
CPU = torch.device("cpu")


@dataclass(frozen=True)
class DenseCopy:
    """What an Int4Linear multiplies inputs of at least `from_rows` rows with (bias not included)."""

    linear: nn.Module  # an nn.Linear, or its PrepackedLinear where oneDNN's prepacked product pays
    from_rows: int


def expand(linear: Int4Linear) -> Tensor:
    """The linear's weight [O, I] over its (permuted) inputs in its compute dtype, expanded a chunk
    of output rows at a time so that the float32 temporaries stay a few MB."""
    layout = layout_for(linear.packed.device, linear.in_features)
    if layout is None:
        # dense_rows rules such a layout out before any copy is asked for
        raise SpecchatError("this torch's int4 layout cannot be read back: no dense copy")
    scales_and_zeros = linear.scales_and_zeros
    step = chunk_rows(linear.in_features, linear.out_features, layout.rows)
    buffers = chunk_buffers(linear.in_features, step, scales_and_zeros.shape[0], torch.float32, linear.packed.device)
    weight = torch.empty(linear.out_features, linear.in_features, dtype=linear.compute_dtype)
    for start in range(0, linear.out_features, step):
        rows = min(step, linear.out_features - start)
        chunk = dequantize_chunk(linear.packed, scales_and_zeros, start, rows, linear.group_size, layout, buffers)
        weight[start:start + rows].copy_(chunk.t())
    return weight


def dense_linear(weight: Tensor) -> nn.Module:
    """`weight` as the dense product that runs it fastest here: prepacked for oneDNN where that pays."""
    if prepack_pays(weight.dtype):
        return PrepackedLinear(weight, None)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype, device=weight.device)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return linear


@cache
def dense_rows(in_features: int, out_features: int, dtype: torch.dtype) -> int | None:
    """The fewest input rows (of PROBE_ROWS) from which a dense copy of an `out_features` x
    `in_features` weight multiplies faster than the fused int4 kernel on this CPU, measured once per
    machine and shape (quant.timing.crossover) and kept (machine_choices.py: measured at every
    startup it moved, here between 2, 4 and 8 rows); None where it never does, or where the layout
    cannot be read back to make the copy."""
    if layout_for(CPU, in_features) is None:
        return None
    return remembered(f"dense copy rows, {in_features}x{out_features}, {dtype}", CPU,
                      lambda: measure_dense_rows(in_features, out_features, dtype))


def measure_dense_rows(in_features: int, out_features: int, dtype: torch.dtype) -> int | None:
    generator = torch.Generator().manual_seed(0)
    nibbles = torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator)
    packed = Int4Linear(in_features, out_features, PROBE_GROUP, False, False, dtype, CPU)
    packed.load_state_dict({
        "packed": pack(nibbles, CPU),
        "scales_and_zeros": (torch.rand(in_features // PROBE_GROUP, out_features, 2, generator=generator) / 64
                             ).to(dtype),
    })
    dense = dense_linear(expand(packed))
    x = torch.randn(max(PROBE_ROWS), in_features, generator=generator).to(dtype)
    return crossover(PROBE_ROWS, lambda rows: dense(x[:rows]), lambda rows: packed(x[:rows]), CPU)


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
        linear.dense = DenseCopy(dense_linear(expand(linear)), dense_rows(*shape_of(linear)))
        kept += copy_bytes(linear)
    return kept


def gaining(model: nn.Module) -> list[Int4Linear]:
    return [m for m in model.modules() if isinstance(m, Int4Linear) and dense_rows(*shape_of(m)) is not None]


def shape_of(linear: Int4Linear) -> tuple[int, int, torch.dtype]:
    return linear.in_features, linear.out_features, linear.compute_dtype


def copy_bytes(linear: Int4Linear) -> int:
    return linear.in_features * linear.out_features * linear.compute_dtype.itemsize
