"""An fp8 linear's input rows scaled and rounded by one Triton kernel on CUDA: what
fp8.quantize_rows computes in five small kernels (the largest magnitude, its clamp, the scale's
product, the rows' division, the cast). In the paper's pair on an H200 (2026-11-30, an 8B draft
in fp8 at budget 1024) those five took 2.2 of a step's 9.2 ms of device time, against 3.5 for the
fp8 products themselves.

One program a row: the row whole in registers (up to 16384 inputs), in float32, then
  scale = max(largest magnitude, TINY) * (1/448),   q = clamp(x / scale, -448, 448) as float8_e4m3fn
with the division IEEE-rounded (div_rn, as torch's is) and the rounding to e4m3 to nearest even, so
that the result is quantize_rows' bit for bit (the tests compare them under Triton's interpreter on
a CPU, in a process that sets TRITON_INTERPRET before importing triton: tl.max is a function of
Triton's library, decorated in the mode of that import). The clamp only guards the cast: x / scale
is at most 448 by construction.
"""

from functools import cache
from typing import Any

import torch
from torch import Tensor

from specchat.triton_support import triton_available

WIDEST = 16384  # inputs a row: a program holds a row whole (Llama-3-8B's down projection reads 14336)
WARPS_FROM = {4096: 4, 16384: 8}  # warps for a row block up to each width: 16-32 float32 values a thread


@cache
def _kernel(interpret: bool) -> Any:
    """The kernel, decorated under TRITON_INTERPRET as it is now (`interpret` only keys the cache:
    Triton reads the setting when `triton.jit` decorates)."""
    import triton
    import triton.language as tl

    @triton.jit
    def quantize(x_ptr, out_ptr, scale_ptr, cols, stride, tiny, inverse, largest_fp8, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        inside = i < cols
        x = tl.load(x_ptr + row * stride + i, mask=inside, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), tiny) * inverse
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -largest_fp8), largest_fp8)
        # e4m3 rounded to nearest even on the bits, not by a cast (Triton's interpreter truncates
        # one); |q| <= 448. A normal (|q| >= 2^-6) keeps 3 of float32's 23 mantissa bits, its
        # exponent rebiased from 127 to 7; a subnormal counts steps of 2^-9, rounded by adding and
        # taking away 2^23 (exact: the count is below 9).
        magnitude = tl.abs(q)
        bits = magnitude.to(tl.uint32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)
        subnormal = ((magnitude * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)
        sign = (q.to(tl.uint32, bitcast=True) >> 31) << 7
        code = tl.where(magnitude >= 0.015625, normal, subnormal) | sign
        tl.store(out_ptr + row * cols + i, code.to(tl.uint8), mask=inside)
        tl.store(scale_ptr + row, scale)

    return quantize


def fused_rows_serve(rows: Tensor) -> bool:
    """Whether the kernel takes these rows on this device: CUDA's, Triton there, rows of at most
    WIDEST inputs each contiguous."""
    return rows.is_cuda and rows.shape[1] <= WIDEST and rows.stride(1) == 1 and triton_available()


def quantize_rows_fused(rows: Tensor, tiny: float, inverse: float, largest: float) -> tuple[Tensor, Tensor]:
    """rows [M, K] -> (float8_e4m3fn [M, K], float32 scales [M, 1]): fp8.quantize_rows' values
    (with its `tiny`, `inverse` 1/448 and `largest` 448) in one kernel, on CUDA or under Triton's
    interpreter."""
    import triton

    count, cols = rows.shape
    quantized = torch.empty(count, cols, dtype=torch.float8_e4m3fn, device=rows.device)
    scale = torch.empty(count, 1, dtype=torch.float32, device=rows.device)
    if count == 0:
        return quantized, scale
    block = triton.next_power_of_2(cols)
    warps = next(warps for width, warps in WARPS_FROM.items() if block <= width)
    _kernel(bool(triton.knobs.runtime.interpret))[(count,)](
        rows, quantized.view(torch.uint8), scale, cols, rows.stride(0), tiny, inverse, largest, BLOCK=block,
        num_warps=warps, enable_fp_fusion=False)  # rounds as torch does, whatever Triton's default (3.10 changes it)
    return quantized, scale
