"""A CPU's float32 linears multiplied by oneDNN's inner product over the widths where it beats MKL.

torch multiplies float32 by MKL's sgemm, which spreads a few rows over the cores poorly. On the
project's AVX2 AMD EPYC (two threads) a 1536 -> 8960 linear took 3.5 / 13.0 / 20.9 / 45.5 ms at
1 / 8 / 32 / 128 rows, and oneDNN's inner product on the same plain weight 2.6 / 5.4 / 10.4 / 30.7;
the 1.5B's 151936-row head 241 / 300 ms at 4 / 16 rows against 87 / 135. Alone on a core oneDNN
wins less, and by shape: 0.62-0.79x MKL's time at 2-32 rows for that 1536 -> 8960 linear, but
0.83-1.27x for an 8960 -> 1536 one and 0.91-1.1x for 1536 -> 1536; from 128 rows MKL is as fast or
faster. So the span of widths where oneDNN wins is measured once per machine and linear shape, for
the threads torch runs, and kept (`onednn_span`); a linear outside it, or of a shape where oneDNN
never wins, stays MKL's.

oneDNN reads the weight where it lies (no packed copy: a call's memory is its output's), so a
linear keeps its parameters, its state_dict and its streamed weights. Both products are float32
GEMMs: the sums run in float32 and only their order differs, as between any two GEMMs (and between
a row multiplied alone and among others, in either): comparisons follow docs/exactness.md's
near-tie rule.
"""

from collections.abc import Iterable
from functools import cache

import torch
from torch import Tensor, nn

from specchat import machine_choices
from specchat.quant import timing

ONEDNN_DTYPES = (torch.float32,)  # half dtypes go through prepacked_linear.py or widened.py instead
ONEDNN_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)  # a token, a chain, tree passes, a prompt's chunk
# The probe's output rows at most: each output row is the same work, so a head's 151936 rows time as
# 8192 of them do (the 1.5B's head probed whole took 25 s on one thread of the AVX2 EPYC, 1.5 s so).
PROBED_OUTPUTS = 8192
# Distinct weights a probe cycles through: 64 MB, past the caches as a model's weights are, in 32 at
# most (a tiny model's would otherwise be thousands of calls a trial).
BANK_BYTES, BANK_WEIGHTS = 64 << 20, 32
CPU = torch.device("cpu")


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., I] @ weight [O, I].T + bias by oneDNN's inner product on the plain weight."""
    flat = x.reshape(-1, weight.shape[1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])


class OneDnnLinear(nn.Linear):
    """An nn.Linear whose inputs of `rows[0]` to `rows[1]` rows (inclusive) oneDNN multiplies."""

    rows: tuple[int, int]

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if not self.rows[0] <= rows <= self.rows[1]:
            return super().forward(x)
        return onednn_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, oneDNN at {self.rows[0]}-{self.rows[1]} rows"


def route(linear: nn.Linear, rows: tuple[int, int]) -> OneDnnLinear:
    """`linear` itself made a OneDnnLinear: its class is swapped (as quant/widened.py's `widen`
    does), so the object, its parameters (a tied head's included) and every reference stay."""
    linear.__class__ = OneDnnLinear
    linear.rows = rows
    return linear


def routes(module: nn.Module) -> bool:
    """A plain nn.Linear in a dtype oneDNN multiplies here: what `route` may take."""
    return type(module) is nn.Linear and module.weight.dtype in ONEDNN_DTYPES


def route_float32_linears(modules: Iterable[nn.Module], device: torch.device) -> int:
    """Make the plain float32 linears of `modules` (a model's, its streamed layers' skeletons' too)
    OneDnnLinears over this CPU's measured span for their shape, where they compute on a CPU;
    returns how many."""
    if device.type != "cpu":
        return 0
    routed = 0
    for module in modules:
        if routes(module) and (span := onednn_span(module.in_features, module.out_features,
                                                   module.weight.dtype)) is not None:
            route(module, span)
            routed += 1
    return routed


def onednn_span(in_features: int, out_features: int, dtype: torch.dtype) -> tuple[int, int] | None:
    """The widths (first and last of ONEDNN_ROWS, inclusive) over which oneDNN multiplies an
    [out_features, in_features] weight of `dtype` faster than F.linear on this CPU; None where it
    never does, or has no kernel for it."""
    return probed_span(in_features, min(out_features, PROBED_OUTPUTS), dtype)


@cache
def probed_span(in_features: int, out_features: int, dtype: torch.dtype) -> tuple[int, int] | None:
    if dtype not in ONEDNN_DTYPES or not torch.backends.mkldnn.is_available():
        return None
    key = {"in_features": in_features, "out_features": out_features, "dtype": str(dtype)}
    span = machine_choices.remembered("oneDNN float32 rows", key, CPU,
                                      lambda: measure_onednn_span(in_features, out_features, dtype))
    return None if span is None else (span[0], span[1])


def measure_onednn_span(in_features: int, out_features: int, dtype: torch.dtype) -> list[int] | None:
    generator = torch.Generator().manual_seed(0)
    copies = min(BANK_WEIGHTS, max(1, BANK_BYTES // (in_features * out_features * dtype.itemsize)))
    weights = [torch.randn(out_features, in_features, generator=generator).to(dtype) for _ in range(copies)]
    x = torch.randn(max(ONEDNN_ROWS), in_features, generator=generator).to(dtype)
    try:
        onednn_linear(x[:1], weights[0])
    except (RuntimeError, AttributeError):  # this torch's oneDNN has no such kernel, or no such op, here
        return None
    span = timing.winning_span(ONEDNN_ROWS, lambda rows: [onednn_linear(x[:rows], w) for w in weights],
                               lambda rows: [nn.functional.linear(x[:rows], w) for w in weights], CPU)
    return None if span is None else list(span)
