"""A draft's linears in 8-bit floats (--draft-quant fp8): half of bf16's bytes, and twice its
matrix rate on GPUs that multiply fp8 (compute capability 8.9 up: Ada, Hopper).

A 7B draft's step over a few hundred tree tokens is bound by its products, not its bytes. Each
weight is stored as float8_e4m3fn with one float32 scale an output row (the row's largest
magnitude maps to e4m3's largest, 448); each input row is scaled likewise as it arrives, and
`torch._scaled_mm` multiplies the two with both scales applied to its float32 sums (rowwise
scaling), rounding once into bfloat16:
  y[m, o] = sum_i (x[m, i] / a_m)_fp8 (w[o, i] / b_o)_fp8 * a_m * b_o  (+ bias[o])
A row of zeros (a static step's pad) keeps a scale of TINY / 448, so no row divides by zero.
Measured on an H200 (2026-11-30, docs/benchmarks.md): a 7B-shaped step captured took 7.0-10.9 ms
at 1-256 tree tokens against bf16's 5.9-9.4. Scaling an input took five small kernels, ~1.2 ms a
step at one token: on CUDA one Triton kernel now does it (fp8_rows.py); the plan weighs
the form by the step it measures (models/draft_step.py), so auto takes it only where it pays,
as its halved bytes may on a card with less VRAM or a slower link.

SpecExec's verifier never reads the draft's probabilities: an fp8 draft grows other trees, never
other tokens (tested on the real pair). Only drafts take this form; a target stays its weights as
stored. A CPU has no fp8 units, and a run refuses the form there; the tests run it there all the
same, its product through `widened_product` (and `scaled_product`, CUDA's, checked against it).
"""

import torch
from torch import nn

from specchat.quant.fp8_rows import fused_rows_serve, quantize_rows_fused

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
INVERSE_MAX = float(torch.tensor(1 / FP8_MAX, dtype=torch.float32))  # 1/448 as float32 holds it
TINY = 1e-12  # the least magnitude a row's scale stands for: a row of zeros quantizes to zeros
MULTIPLE = 16  # _scaled_mm takes inner and output sizes that are multiples of 16
# Weight rows quantized at a time: the division's float32 temporary stays within 4096 rows (235 MB
# for a 7B's 14336-wide down projection; whole, a stacked gate/up of Llama-3-8B would take 470 MB).
WEIGHT_ROWS = 4096
CAPABILITY = (8, 9)  # the first CUDA devices with fp8 matrix units (Ada)


class Fp8Linear(nn.Module):
    """An nn.Linear's product in fp8: its weight [O, I] as float8_e4m3fn with a float32 scale a
    row, its bias (if any) as it was."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        quantized, scale = quantize_weight(linear.weight.detach())
        self.register_buffer("weight", quantized)  # [O, I], row-major: its .t() is the column-major operand
        self.register_buffer("scale", scale.view(1, -1))  # [1, O]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.widened: torch.Tensor | None = None  # a CPU's: `widened_product`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        quantized, scale = quantize_rows_fused(rows, TINY, INVERSE_MAX, FP8_MAX) if fused_rows_serve(rows) \
            else quantize_rows(rows)
        if quantized.is_cuda:
            out = scaled_product(quantized, scale, self.weight, self.scale, x.dtype)
        else:
            out = self.widened_product(quantized, scale, x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def widened_product(self, quantized: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A CPU's product of the same operands. torch's _scaled_mm there widens the weight on every
        call: ~50x bf16's time, ~1 s a step of the embedded 0.5B draft on the AMD EPYC. Here the
        weight is widened once to bfloat16 (exactly: every e4m3 value is a bfloat16 one) and kept
        beside it as a plain attribute, outside the module's tensors, which the plan counts for a
        GPU; the product's float32 sums are rounded to bfloat16 before the scales apply, a second
        rounding the GPU's path does not make (a draft may be approximated freely)."""
        if self.widened is None:
            self.widened = self.weight.to(torch.bfloat16)
        product = torch.mm(quantized.to(torch.bfloat16), self.widened.t()).float()
        return (product * scale * self.scale).to(dtype)


def scaled_product(quantized: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """CUDA's product: fp8 matrix units, both scales applied to the float32 sums, rounded once into
    bfloat16 (the one output rowwise scaling takes), then into `dtype`. `weight` [O, I] is
    row-major, so its transpose is the column-major operand cuBLAS takes."""
    out = torch._scaled_mm(quantized, weight.t(), scale_a=scale, scale_b=weight_scale, out_dtype=torch.bfloat16)
    return out.to(dtype)


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [M, K] -> (rows / scale as float8_e4m3fn [M, K], scale float32 [M, 1]), scale = the
    row's largest magnitude times 1/448 (float32's nearest): three small kernels for the scale, two
    for the rows. A product by the reciprocal, not a division by 448: torch on CUDA divides a
    tensor by a number so (its values differed from a CPU's division in 55% of a million draws),
    and the CPU and CUDA paths, and fp8_rows' kernel, are one function."""
    largest = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True, dtype=torch.float32)
    scale = largest.clamp_(min=TINY).mul_(INVERSE_MAX)
    return (rows / scale).to(FP8), scale


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows` of a weight [O, I], WEIGHT_ROWS rows at a time."""
    quantized = torch.empty(weight.shape, dtype=FP8, device=weight.device)
    scale = torch.empty(weight.shape[0], 1, dtype=torch.float32, device=weight.device)
    for start in range(0, weight.shape[0], WEIGHT_ROWS):
        quantized[start:start + WEIGHT_ROWS], scale[start:start + WEIGHT_ROWS] = quantize_rows(
            weight[start:start + WEIGHT_ROWS])
    return quantized, scale


def fp8_linears(module: nn.Module) -> int:
    """Replace every nn.Linear inside `module` whose sizes `_scaled_mm` takes (multiples of 16) by
    an Fp8Linear of it; how many. A draft's decoder layers take this after their projections are
    stacked (quant/stacked.py), so one fp8 product serves each stack."""
    found = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.in_features % MULTIPLE == 0 and child.out_features % MULTIPLE == 0]
    for parent, name, child in found:
        setattr(parent, name, Fp8Linear(child))
    return len(found)


def fp8_weight_bytes(linear: nn.Module) -> int:
    """Bytes an Fp8Linear of `linear` holds: a byte a weight and a float32 scale a row (its bias,
    if any, is counted where it already was)."""
    return linear.weight.numel() + linear.out_features * 4


def fp8_runs_on(device: torch.device) -> bool:
    """Whether `device` multiplies fp8: CUDA from compute capability 8.9."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= CAPABILITY
