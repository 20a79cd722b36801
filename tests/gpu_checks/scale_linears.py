"""The scale check's per-linear tables: one int4 linear at each of the target's shapes (then of the
draft's, rounded to 4 bits), input rows of a token to the widest tree, through torch's fused int4
kernel, the wide path, a dense bf16 matmul over a weight of the same shape and, on a GPU,
int4_gemm's kernel (each tile expanded in registers, from its own words and from torch's tiles:
what a draft's steps run where a probe finds it faster). The wide path is CUDA's expansion (int4_expand: the
weight expanded a chunk at a time, then one matmul) on a GPU, and on a CPU the product an
Int4Linear runs there (quant/int4.py)."""

import math
from dataclasses import dataclass

import torch
from gpu_checks.markdown import markdown_table, ms
from gpu_checks.suite import release_memory
from gpu_checks.timing import fastest_ms
from gpu_checks.verdict import Verdict, judged, skipped
from torch import Tensor
from transformers import PretrainedConfig

from specchat.quant.gptq import read_gptq_spec
from specchat.quant.int4 import Int4Linear, int4_linear
from specchat.quant.int4_expand import expanded_linear
from specchat.quant.int4_gemm import gemm_words, w4a16_linear, w4a16_tiled_linear
from specchat.quant.int4_gptq import spec_group_size
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import fused_linear
from specchat.quant.int4_rtn import GROUP as ROUNDED_GROUP
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.widths import int4_product
from specchat.triton_support import triton_available

DTYPE = torch.bfloat16
VERDICT_SHAPE = (8192, 28672)  # (in, out): a 70B MLP's up and gate projections
VERDICT_ROWS = 1024
BOUND_MS = 1.5  # issue 36's goal on an H100 or H200, where the fused kernel alone took 16.3 ms


@dataclass(frozen=True)
class LinearRow:
    shape: tuple[int, int]  # (in, out)
    rows: int
    fused_ms: float
    wide_ms: float | None  # None: no wide path on this device
    dense_ms: float
    gemm_ms: float | None = None  # int4_gemm's kernel (tiles expanded in registers); None: Triton cannot run here
    tiled_gemm_ms: float | None = None  # the same, reading the packed weight torch's layout holds


def linear_shapes(config: PretrainedConfig) -> list[tuple[int, int]]:
    """(in, out) of a decoder layer's distinct linears: q and o, k and v, gate and up, down."""
    hidden, mlp = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    return [(hidden, hidden), (hidden, kv), (hidden, mlp), (mlp, hidden)]


def random_int4(in_features: int, out_features: int, group_size: int, generator: torch.Generator) -> Int4Weight:
    groups = in_features // group_size
    nibbles = torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator)
    scales = torch.rand(groups, out_features, generator=generator) / 64
    zeros = torch.randn(groups, out_features, generator=generator) / 64
    return Int4Weight(nibbles, scales, zeros, None)


def wide_path_missing(device: torch.device, in_features: int) -> str | None:
    """Why CUDA's expansion cannot run here (None: it can; a CPU's product always runs)."""
    if device.type != "cuda":
        return None
    if not triton_available():
        return "Triton cannot run here: pip install triton (torch's CUDA wheels bring it on Linux)"
    if layout_for(device, in_features) is None:
        return f"torch {torch.__version__}'s CUDA int4 layout cannot be read back"
    return None


def wide(linear: Int4Linear, x: Tensor) -> Tensor:
    if x.device.type == "cuda":
        return expanded_linear(x, linear.packed, linear.scales_and_zeros, linear.group_size,
                               layout_for(x.device, linear.in_features))
    return int4_product(linear, x, linear.scales_and_zeros)


def shape_rows(shape: tuple[int, int], group_size: int, all_rows: tuple[int, ...], device: torch.device,
               generator: torch.Generator) -> list[LinearRow]:
    in_features, out_features = shape
    weight = random_int4(in_features, out_features, group_size, generator)
    linear = int4_linear(weight, None, DTYPE, device)
    dense = torch.randn(out_features, in_features, generator=generator).to(device, DTYPE) / in_features ** 0.5
    x = torch.randn(max(all_rows), in_features, generator=generator).to(device, DTYPE)
    missing = wide_path_missing(device, in_features)
    words = gemm_words(weight).to(device) if device.type == "cuda" and triton_available() else None
    rows = []
    for count in all_rows:
        part = x[:count]
        rows.append(LinearRow(
            shape, count,
            fastest_ms(lambda: fused_linear(part, linear.packed, linear.scales_and_zeros, group_size), device),
            None if missing else fastest_ms(lambda: wide(linear, part), device),
            fastest_ms(lambda: torch.nn.functional.linear(part, dense), device),
            None if words is None else fastest_ms(
                lambda: w4a16_linear(part, words, linear.scales_and_zeros, group_size), device),
            None if words is None or missing else fastest_ms(lambda: w4a16_tiled_linear(
                part, linear.packed, linear.scales_and_zeros, group_size, layout_for(device, in_features)), device)))
    return rows


def linear_rows(config: PretrainedConfig, settings: dict | None, all_rows: tuple[int, ...],
                device: torch.device) -> list[LinearRow]:
    """The table's rows, each shape in the kernel groups its GPTQ layers get (group -1: 256), or
    with no GPTQ `settings` (a draft rounded to 4 bits) int4_rtn's GROUP."""
    spec = read_gptq_spec({"quantization_config": settings}) if settings is not None else None
    generator = torch.Generator().manual_seed(0)
    rows = []
    for shape in linear_shapes(config):
        group_size = spec_group_size(spec, shape[0]) if spec is not None else math.gcd(ROUNDED_GROUP, shape[0])
        rows += shape_rows(shape, group_size, all_rows, device, generator)
        release_memory()
    return rows


def linear_table(rows: list[LinearRow]) -> str:
    return markdown_table(
        ["in x out", "rows", "fused int4, ms", "wide path, ms", "dense bf16, ms", "int4 gemm (registers), ms",
         "int4 gemm on torch's tiles, ms"],
        [[f"{r.shape[0]}x{r.shape[1]}", str(r.rows), ms(r.fused_ms), ms(r.wide_ms), ms(r.dense_ms), ms(r.gemm_ms),
          ms(r.tiled_gemm_ms)] for r in rows])


def linear_verdict(rows: list[LinearRow], device: torch.device, dry_run: bool) -> Verdict:
    check = f"{VERDICT_SHAPE[0]}x{VERDICT_SHAPE[1]} int4 product at {VERDICT_ROWS} rows, wide path"
    if dry_run:
        return skipped(check, "dry run: no verdict")
    row = next((r for r in rows if r.shape == VERDICT_SHAPE and r.rows == VERDICT_ROWS), None)
    if row is None:
        return judged(check, False, "not measured: the table has no such row")
    if row.wide_ms is None:
        return judged(check, False, f"no wide path: {wide_path_missing(device, VERDICT_SHAPE[0])}")
    return judged(check, row.wide_ms <= BOUND_MS,
                  f"{row.wide_ms:.3f} ms (bound {BOUND_MS:g}); fused {row.fused_ms:.3f}, dense {row.dense_ms:.3f}")
