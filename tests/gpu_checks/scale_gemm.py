"""`--scale --parts gemm`: int4_gemm's blocks swept at a 4-bit draft's shapes (the pair's
llama-3.1-8b-awq: group 128 AWQ), reading torch's tiles as a draft's Int4Linear does. Per linear
and input rows: the fused int4 kernel, dense bf16, int4_gemm with blocks_for's blocks and with
the fastest of the grid; then, per input rows, the blocks fastest over a whole decoder layer (q, k,
v, o, gate, up, down), which is what blocks_for should return. The dry run sweeps two blocks over
shrunk shapes (on a CPU under TRITON_INTERPRET=1; without it the kernel's columns are n/a)."""

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from gpu_checks.markdown import markdown_table, ms
from gpu_checks.scale_linears import linear_shapes, random_int4
from gpu_checks.scale_models import alias_config
from gpu_checks.scale_sizes import ScaleSizes
from gpu_checks.timing import mean_ms
from transformers import PretrainedConfig

from specchat.quant.gemm_blocks import Blocks, block_rows, blocks_for
from specchat.quant.int4 import int4_linear
from specchat.quant.int4_gemm import w4a16_tiled_linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import fused_linear
from specchat.triton_support import triton_available

GEMM_ALIAS = "llama-3.1-8b-awq"
DTYPE = torch.bfloat16
REPEATS = 20  # launches a timing; a product of a few rows takes microseconds


@dataclass(frozen=True)
class GemmRow:
    shape: tuple[int, int]  # (in, out)
    rows: int
    fused_ms: float
    dense_ms: float
    timings: dict[Blocks, float]  # int4_gemm's, the grid's every blocks; empty where it cannot run

    @property
    def best(self) -> Blocks | None:
        return min(self.timings, key=self.timings.__getitem__, default=None)


def block_grid(rows: int, dry_run: bool) -> list[Blocks]:
    """blocks_for's blocks first, then the grid's for `rows` rows (two in a dry run)."""
    default = blocks_for(rows)
    if dry_run:
        return [default, replace(default, splits=2)]
    grid = [Blocks(block_rows(rows), outs, ins, splits) for outs in (32, 64, 128) for ins in (64, 128)
            for splits in (1, 2, 4, 8)]
    return [default] + [blocks for blocks in grid + wide_blocks(rows) if blocks != default]


def wide_blocks(rows: int) -> list[Blocks]:
    """Blocks for 128 rows and more, where the product computes rather than reads: 128-row blocks
    (each weight tile expanded once for 128 rows, not 64) and 8 warps, loading 3 or 4 tiles ahead. At
    256 rows the grid's fastest, 64 x 64 x 128 over 4 warps, ran a 8B layer's linears at a fifth of
    dense bf16's speed on an H200 (1.29 against 0.25 ms). Compiled for sm_90 they hold 96-224 KiB of
    shared memory (the H200 has 227); those past a card's are left out at launch."""
    if rows < 128:
        return []
    taller = [Blocks(128, outs, ins, 1, warps, stages) for outs in (64, 128) for ins in (64, 128)
              for warps in (4, 8) for stages in (3, 4)]
    return taller + [Blocks(64, outs, ins, 1, 8) for outs in (64, 128) for ins in (64, 128)]


def layer_uses(config: PretrainedConfig) -> dict[tuple[int, int], int]:
    """(in, out) of a decoder layer's linears, and how many it has of each: two of each of
    linear_shapes' but the last (q and o, k and v, gate and up; down)."""
    uses: Counter[tuple[int, int]] = Counter()
    for shape, count in zip(linear_shapes(config), (2, 2, 2, 1)):
        uses[shape] += count  # k and v are q's shape where attention is not grouped
    return dict(uses)


def kernel_runs(device: torch.device) -> bool:
    import triton

    return triton_available() and (device.type == "cuda" or bool(triton.knobs.runtime.interpret))


def gemm_rows(sizes: ScaleSizes, device: torch.device) -> list[GemmRow]:
    config, settings = alias_config(GEMM_ALIAS, 1, gemm_shrink(sizes))
    generator = torch.Generator().manual_seed(0)
    repeats, runs = (1, 1) if sizes.dry_run else (REPEATS, 3)  # the interpreter takes ~50 ms a launch
    rows = []
    for in_features, out_features in layer_uses(config):
        group_size = math.gcd(settings["group_size"], in_features)
        weight = random_int4(in_features, out_features, group_size, generator)
        linear = int4_linear(weight, None, DTYPE, device)
        layout = layout_for(device, in_features) if kernel_runs(device) else None
        dense = torch.randn(out_features, in_features, generator=generator).to(device, DTYPE) / in_features ** 0.5
        x = torch.randn(max(sizes.gemm_rows), in_features, generator=generator).to(device, DTYPE)
        for count in sizes.gemm_rows:
            part = x[:count]
            timings = {} if layout is None else timed_blocks(
                lambda blocks: w4a16_tiled_linear(part, linear.packed, linear.scales_and_zeros, group_size, layout,
                                                  blocks), block_grid(count, sizes.dry_run), device, repeats, runs)
            rows.append(GemmRow(
                (in_features, out_features), count,
                mean_ms(lambda: fused_linear(part, linear.packed, linear.scales_and_zeros, group_size), device,
                        repeats, runs),
                mean_ms(lambda: torch.nn.functional.linear(part, dense), device, repeats, runs), timings))
    return rows


def timed_blocks(product: Callable[[Blocks], torch.Tensor], grid: list[Blocks], device: torch.device,
                 repeats: int, runs: int) -> dict[Blocks, float]:
    """ms of `product` with each of `grid`'s blocks; blocks that need more shared memory than the GPU
    has (Triton's OutOfResources at launch) are left out, and said."""
    from triton.runtime.errors import OutOfResources

    timings = {}
    for blocks in grid:
        try:
            timings[blocks] = mean_ms(lambda: product(blocks), device, repeats, runs)
        except OutOfResources as error:
            print(f"left out {named(blocks)}: {error}", flush=True)
    return timings


def gemm_shrink(sizes: ScaleSizes) -> dict:
    """The draft's shrink, its special tokens within the shrunk vocabulary (llama 3's lie past it)."""
    return sizes.draft_shrink and sizes.draft_shrink | {"bos_token_id": 0, "eos_token_id": 0}


def named(blocks: Blocks | None) -> str:
    if blocks is None:
        return "n/a"
    return f"{blocks.rows}x{blocks.outs}x{blocks.ins}, {blocks.splits} split, {blocks.warps} warps, {blocks.stages} stages"


def gemm_table(rows: list[GemmRow]) -> str:
    return markdown_table(
        ["in x out", "rows", "fused int4, ms", "dense bf16, ms", "int4 gemm blocks_for, ms", "fastest blocks",
         "its ms"],
        [[f"{r.shape[0]}x{r.shape[1]}", str(r.rows), ms(r.fused_ms), ms(r.dense_ms),
          ms(r.timings.get(blocks_for(r.rows))), named(r.best), ms(r.timings.get(r.best))] for r in rows])


def layer_table(rows: list[GemmRow], uses: dict[tuple[int, int], int]) -> str:
    """Per input rows: a decoder layer's linears (`uses`) with the blocks fastest over all of them,
    with blocks_for's, through the fused kernel and dense."""
    lines = []
    for count in sorted({r.rows for r in rows}):
        of = [r for r in rows if r.rows == count]
        common = set.intersection(*(set(r.timings) for r in of))

        def layer_ms(blocks: Blocks) -> float:
            return sum(uses[r.shape] * r.timings[blocks] for r in of)

        best = min(common, key=layer_ms, default=None)
        lines.append([str(count), named(best), ms(None if best is None else layer_ms(best)),
                      ms(layer_ms(blocks_for(count)) if blocks_for(count) in common else None),
                      ms(sum(uses[r.shape] * r.fused_ms for r in of)), ms(sum(uses[r.shape] * r.dense_ms for r in of))])
    return markdown_table(["rows", "fastest blocks over a layer", "layer ms", "blocks_for's, ms", "fused int4, ms",
                           "dense bf16, ms"], lines)
