"""The int4 products against an independent dense reference: random 4-bit weights at the 70B
target's shapes (act-order: a random input permutation), multiplied by every product the device
has (the fused kernel; on CUDA the expansion and int4_gemm's kernel; the one the linear picks at
that width; and a dense draft's linear, the weight expanded once), against x @ w.T in float64 with w from Int4Weight.dequantize(), which shares no
code with the packing, the kernels or their layouts. A packing or layout error moves the output by
its own size; bf16 inputs, weights and outputs by a few thousandths (BOUND). On CUDA the expansion is part of what is checked:
where Triton or torch's tile layout is missing there, the verdict is SKIP with that reason (the
other products' errors beside it), never a PASS without it."""

import copy
import math
from collections.abc import Callable

import torch
from gpu_checks.verdict import Verdict, judged, skipped
from torch import Tensor, nn

from specchat.quant.int4 import Int4Linear, int4_linear
from specchat.quant.int4_dense import expand_linears
from specchat.quant.int4_expand import expanded_linear
from specchat.quant.int4_gemm import gemm_words, w4a16_linear, w4a16_tiled_linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import fused_linear
from specchat.quant.int4_weight import Int4Weight
from specchat.triton_support import triton_available

SHAPES_70B = ((8192, 8192), (8192, 1024), (8192, 28672), (28672, 8192))  # (in, out)
GROUP_SIZE = 128  # GPTQ's usual groups
ROWS = (1, 1024)  # a token, and a tree the expansion serves
# Relative error, |y - reference| / |reference| over the whole output. Measured: 0.0024 for every
# product (its own, fused, expanded) at every 70B shape on an H200, 2026-11-26 (docs/benchmarks.md,
# "The paper-scale check on an NVIDIA H200", docs/bench/gpu-2026-11-26-h200/gpu-check.log); on the
# AMD EPYC of the project, 2026-11-28, 0.0018 at the CPU test's shapes and 0.0017 at 8192 x 1024;
# there, 2026-11-29, 0.0027 for a dense draft's linear (its weights rounded to bf16 once more).
# The bound is 2x the H200's, 1.8x the dense draft's: a scale one bf16 step off (x 1 + 2^-7) reads
# ~0.008 and fails.
BOUND = 0.0048
DTYPE = torch.bfloat16
CHECK = "int4 products vs a float64 dense reference"


def random_weight(in_features: int, out_features: int, device: torch.device, generator: torch.Generator
                  ) -> Int4Weight:
    """Scales and zeros that bf16 holds exactly, so that the reference and the kernels start from
    the same numbers (packing in bf16 rounds them otherwise)."""
    groups = in_features // GROUP_SIZE
    size = 1 / (4.6 * math.sqrt(in_features))  # outputs of unit size for unit inputs
    scales = ((0.5 + torch.rand(groups, out_features, generator=generator)) * size).bfloat16().float()
    zeros = (torch.randn(groups, out_features, generator=generator) * size).bfloat16().float()
    nibbles = torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator)
    perm = torch.randperm(in_features, generator=generator)
    return Int4Weight(nibbles.to(device), scales.to(device), zeros.to(device), perm.to(device))


def products(linear: Int4Linear, words: Tensor | None = None) -> dict[str, Callable[[Tensor], Tensor]]:
    """Each product by name, taking the layer's inputs (before the act-order permutation); with
    `words` (int4_gemm's layout of the same weight) int4_gemm's kernel too."""
    def permuted(x: Tensor) -> Tensor:
        return x.index_select(1, linear.perm)

    named = {"its own": linear,
             "fused": lambda x: fused_linear(permuted(x), linear.packed, linear.scales_and_zeros, linear.group_size)}
    if layout_for(linear.packed.device, linear.in_features) is not None:  # a draft's, loaded --draft-quant dense
        named["dense draft"] = expanded_draft_linear(linear)
    if linear.kernel == "cuda" and expansion_missing(linear) is None:
        layout = layout_for(linear.packed.device, linear.in_features)
        named["expanded"] = lambda x: expanded_linear(permuted(x), linear.packed, linear.scales_and_zeros,
                                                      linear.group_size, layout)
    if words is not None:
        named["registers"] = lambda x: w4a16_linear(permuted(x), words, linear.scales_and_zeros, linear.group_size)
        if expansion_missing(linear) is None:
            layout = layout_for(linear.packed.device, linear.in_features)
            named["registers, tiles"] = lambda x: w4a16_tiled_linear(permuted(x), linear.packed,
                                                                     linear.scales_and_zeros, linear.group_size, layout)
    return named


def expanded_draft_linear(linear: Int4Linear) -> nn.Module:
    """A copy of `linear` expanded as a GPTQ or AWQ draft loaded dense is (quant/int4_dense.py: on
    CUDA by the expansion kernel), taking the layer's inputs."""
    holder = nn.Sequential(copy.deepcopy(linear))
    expand_linears(holder)
    return holder[0]


def expansion_missing(linear: Int4Linear) -> str | None:
    """Why the expansion (CUDA's product for wide inputs) cannot run for `linear` here, or None."""
    if not triton_available():
        return "Triton is not installed, or has no device to run on"
    if layout_for(linear.packed.device, linear.in_features) is None:
        return f"torch's int4 layout at {linear.in_features} inputs is no grid of tiles"
    return None


def relative_error(got: Tensor, reference: Tensor) -> float:
    return float((got.double() - reference).norm() / reference.norm())


def shape_errors(linear: Int4Linear, dense: Tensor, generator: torch.Generator,
                 words: Tensor | None = None) -> dict[str, float]:
    """The largest relative error of each product of `linear` against `dense`, over ROWS."""
    errors: dict[str, float] = {}
    for rows in ROWS:
        x = torch.randn(rows, linear.in_features, generator=generator).to(linear.packed.device, DTYPE)
        reference = x.double() @ dense.t()
        for name, product in products(linear, words).items():
            errors[name] = max(errors.get(name, 0.0), relative_error(product(x), reference))
    return errors


def check_int4_reference(device: torch.device, shapes: tuple[tuple[int, int], ...] = SHAPES_70B) -> Verdict:
    generator = torch.Generator().manual_seed(0)
    errors: dict[tuple[int, int], dict[str, float]] = {}
    missing: set[str] = set()
    for in_features, out_features in shapes:
        weight = random_weight(in_features, out_features, device, generator)
        linear = int4_linear(weight, None, DTYPE, device)
        words = gemm_words(weight) if linear.kernel == "cuda" and triton_available() else None
        errors[in_features, out_features] = shape_errors(linear, weight.dequantize().double(), generator, words)
        if linear.kernel == "cuda" and (reason := expansion_missing(linear)) is not None:
            missing.add(reason)
    return verdict_of(device, errors, missing)


def verdict_of(device: torch.device, errors: dict[tuple[int, int], dict[str, float]], missing: set[str]) -> Verdict:
    """FAIL past BOUND; else SKIP where CUDA's expansion could not run (`missing`: why), else PASS."""
    worst = max(error for named in errors.values() for error in named.values())
    detail = "; ".join(f"{i}x{o}: " + ", ".join(f"{name} {error:.4f}" for name, error in named.items())
                       for (i, o), named in errors.items())
    measured = f"largest relative error {worst:.4f} (bound {BOUND:g}) at rows {ROWS}; {detail}"
    if worst <= BOUND and missing:
        return skipped(f"{CHECK} ({device.type})", f"the expansion did not run: {'; '.join(sorted(missing))}; "
                                                   f"the other products' {measured}")
    return judged(f"{CHECK} ({device.type})", worst <= BOUND, measured)
