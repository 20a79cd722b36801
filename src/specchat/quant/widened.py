"""A CPU's dense half-precision products, widened to float32 where the CPU has no half arithmetic.

Without avx512_bf16 or AMX, torch multiplies bf16 by a generic kernel that does not get faster per
row as the rows grow: on the project's AVX2 AMD EPYC (one thread) a 1536 -> 8960 linear took 2.6 ms
at one row, 40 at 16 and 159 at 64 (10.7 GFLOP/s at every width), where float32's sgemm reaches
70 GFLOP/s. Widened, the weight is converted to float32 a chunk of CHUNK_WEIGHTS weights (whole
output rows) at a time into one buffer and the input, widened once, is multiplied by each chunk in
float32: 11 ms at 16 rows, 29 at 64. The conversion reads every weight each call, so one row keeps
the half kernel: the rows from which widening wins are measured once per machine and kept
(`widened_rows`, a choice machine_choices.py keeps), none where it never wins (as expected of a
CPU with bf16 instructions, whose own kernel is faster; there the linears are prepacked anyway).

The arithmetic is a bf16 GEMM's: half values and their products are exact in float32, the sums run
in float32 and are rounded once to the input's dtype. Only the order of the additions can differ
from torch's kernel's, as between any two GEMMs: bf16 comparisons follow docs/exactness.md's
near-tie rule.
"""

from functools import cache

import torch
from torch import Tensor, nn

from specchat import machine_choices
from specchat.quant import timing
from specchat.quant.timing import LinearShape

# Weights converted at once: 4 MB of float32. Of 0.25, 0.5, 1, 2 and 4 Mi weights timed on the AVX2
# EPYC (one and two threads, three shapes up to a 32768-row head, 1-256 rows) 1 Mi was the fastest
# in most cells and never more than 15% behind the fastest.
CHUNK_WEIGHTS = 1 << 20
WIDENED_DTYPES = (torch.bfloat16, torch.float16)
WIDENED_ROWS = (2, 4, 8, 16, 32, 64)  # the widths the probe races the two products at: a chain, then trees
WIDENED_SHAPE = LinearShape(2048, 8192)  # 32 MB in bf16, past the caches, as a decoder's weights are
CPU = torch.device("cpu")


def chunk_rows(in_features: int, out_features: int) -> int:
    """Output rows converted at once: CHUNK_WEIGHTS' worth, at least one, at most the weight's own."""
    return min(out_features, max(1, CHUNK_WEIGHTS // in_features))


def widened_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., I] @ weight [O, I].T + bias, in float32, rounded once to x's dtype."""
    out_features, in_features = weight.shape
    flat = x.reshape(-1, in_features)
    rows, step = flat.shape[0], chunk_rows(in_features, out_features)
    wide = flat.float()
    chunk = torch.empty(step, in_features, device=x.device)
    part = torch.empty(rows * step, device=x.device)  # a chunk's product, float32
    out = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    for start in range(0, out_features, step):
        n = min(step, out_features - start)
        converted = chunk[:n].copy_(weight[start:start + n])
        product = torch.mm(wide, converted.t(), out=part[:rows * n].view(rows, n))
        if bias is not None:
            product += bias[start:start + n]
        out[:, start:start + n] = product
    return out.reshape(*x.shape[:-1], out_features)


def widened_workspace(in_features: int, out_features: int, rows: int) -> int:
    """The bytes `widened_linear` allocates beside its output for `rows` input rows: the widened
    input, the float32 chunk and a chunk's product."""
    step = chunk_rows(in_features, out_features)
    return 4 * (rows * in_features + step * in_features + rows * step)


class WidenedLinear(nn.Linear):
    """An nn.Linear whose inputs of `from_rows` rows or more are multiplied widened to float32."""

    from_rows: int

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() < self.from_rows * self.in_features:
            return super().forward(x)
        return widened_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, widened from {self.from_rows} rows"


def widen(linear: nn.Linear, from_rows: int) -> WidenedLinear:
    """`linear` itself made a WidenedLinear: its class is swapped, as torch.nn.utils.parametrize
    swaps a module's, so the object, its parameters (a tied head's included) and every reference to
    them stay as they were, and its state_dict is nn.Linear's."""
    linear.__class__ = WidenedLinear
    linear.from_rows = from_rows
    return linear


def widens(module: nn.Module) -> bool:
    """A plain nn.Linear in a half dtype: what `widen` may take."""
    return type(module) is nn.Linear and module.weight.dtype in WIDENED_DTYPES


@cache
def widened_rows(dtype: torch.dtype) -> int | None:
    """From how many rows (of WIDENED_ROWS) a widened product of `dtype` beats the dense one on this
    CPU; None where it never does, or `dtype` is not a half dtype."""
    if dtype not in WIDENED_DTYPES:
        return None
    return machine_choices.remembered("widened rows", {"dtype": str(dtype)}, CPU,
                                      lambda: measure_widened_rows(dtype))


def measure_widened_rows(dtype: torch.dtype) -> int | None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(WIDENED_SHAPE.out_features, WIDENED_SHAPE.in_features, generator=generator).to(dtype)
    x = torch.randn(max(WIDENED_ROWS), WIDENED_SHAPE.in_features, generator=generator).to(dtype)
    return timing.crossover(WIDENED_ROWS, lambda rows: widened_linear(x[:rows], weight),
                            lambda rows: nn.functional.linear(x[:rows], weight), CPU)

