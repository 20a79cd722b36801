"""How far apart two float32 products of the same weights may be on any CPU, whatever order their
kernels sum in.

Each of x @ W^T + b is within gamma_n * (|x| @ |W|^T + |b|) of the exact sum (Higham, Accuracy and
Stability of Numerical Algorithms, section 3.1: gamma_n = n u / (1 - n u), u = 2^-24), with n the
inputs, one more for the bias and one for a kernel that expands a 4-bit weight itself (rounded once);
two such products differ by at most twice that. A bound measured on one CPU breaks on the next, whose
kernels block their sums otherwise; this one does not."""

import torch

UNIT_ROUNDOFF = 2.0**-24  # float32


def summation_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The largest difference, elementwise, between two float32 computations of x @ weight^T + bias."""
    n = weight.shape[1] + 2
    gamma = n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)
    magnitude = x.abs() @ weight.abs().t() + (0 if bias is None else bias.abs())
    return 2 * gamma * magnitude
