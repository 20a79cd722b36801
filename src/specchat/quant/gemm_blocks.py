"""The blocks int4_gemm's kernel multiplies in, and blocks a card's shared memory holds.

A program of the kernel holds its tiles of inputs and of expanded weights in shared memory, a
tile for each stage Triton's pipeline loads ahead. How much is the compiler's to say, and cards
differ: compiled for sm_90 (H100, H200: 227 KiB a block) the 64 x 64 x 128 blocks that ran a
draft's 256-row steps fastest there need 80 KiB on torch's tiles, compiled for sm_89 (the RTX 4090
the SpecExec paper ran on, and sm_86's RTX 3090: 99 KiB a block) 112 KiB, and 32 x 64 x 128 104 KiB
(Triton 3.9, tests/quant/test_gemm_blocks.py). Such blocks raise Triton's OutOfResources at launch,
before anything runs; the kernel then steps down to smaller blocks until a launch takes them, and
remembers what ran for the next call.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

# tl.dot takes 16 rows at least: fewer are padded with masked loads.
BLOCK_ROWS = (16, 32, 64)
LEAST_BLOCK = 16  # tl.dot's least tile side
LEAST_STAGES = 2  # a tile loaded ahead: one stage would load and multiply in turn

Out = TypeVar("Out")


@dataclass(frozen=True)
class Blocks:
    """What one program multiplies, and how many programs share a row block's inputs."""

    rows: int  # input rows (BLOCK_M)
    outs: int  # outputs (BLOCK_N)
    ins: int  # inputs a step of its loop (BLOCK_K), cut to a divisor of the group size
    splits: int  # programs along the inputs, each summing its share; the shares are added after
    warps: int = 4
    stages: int = 3  # tiles Triton's pipeline loads ahead (its default on CUDA); each costs shared memory


# blocks_for's blocks as they ran, per (device, dtype, tiles read) and the blocks asked for
FITTED: dict[tuple[Any, Blocks], Blocks] = {}


def block_rows(rows: int) -> int:
    """The fewest of BLOCK_ROWS covering `rows`, the largest past them (the grid covers the rest)."""
    return next((block for block in BLOCK_ROWS if rows <= block), BLOCK_ROWS[-1])


def blocks_for(rows: int) -> Blocks:
    """The blocks a product of `rows` rows runs: those fastest over a llama-3.1-8b-awq decoder layer's
    linears (4096 x 4096, 1024, 14336 and 14336 x 4096, groups of 128) on an H200 (2026-11-28,
    `gpu_check.sh --scale --parts gemm`, docs/benchmarks.md): at 1 and 16 rows 16 x 32 x 128, at
    64 and 256 64 x 64 x 128, none split (0.66 and 1.29 ms a layer against 1.09 and 2.78 with the
    first guess, 16 x 64 x 64). Those products were timed eagerly, so that up to 64 rows Triton's
    launch weighed on every block alike; the sweep now times them replayed from a CUDA graph, as a
    captured step runs them."""
    if rows <= 16:
        return Blocks(16, 32, 128, 1)
    return Blocks(block_rows(rows), 64, 128, 1)


def smaller(blocks: Blocks) -> Blocks | None:
    """The blocks to try where `blocks` need more shared memory than the card has: fewer stages
    (down to LEAST_STAGES), then half the inputs a step, then half the outputs, then half the rows
    (down to LEAST_BLOCK); None where none is smaller."""
    if blocks.stages > LEAST_STAGES:
        return replace(blocks, stages=blocks.stages - 1)
    for side in ("ins", "outs", "rows"):
        if getattr(blocks, side) > LEAST_BLOCK:
            return replace(blocks, **{side: getattr(blocks, side) // 2})
    return None


def launch_fitted(card: Any, wanted: Blocks, run: Callable[[Blocks], Out]) -> Out:
    """`run` with `wanted`, or with the first smaller blocks a launch on `card` takes (Triton raises
    OutOfResources before it launches anything); FITTED keeps what ran, so that later calls (and
    the steps a CUDA graph captures) launch it at once."""
    if (fitted := FITTED.get((card, wanted))) is not None:
        return run(fitted)  # fitted at an earlier launch: the eager step's every call takes this path
    from triton.runtime.errors import OutOfResources  # triton is there once a kernel launches

    blocks = wanted
    while True:
        try:
            out = run(blocks)
        except OutOfResources:
            step = smaller(blocks)
            if step is None:
                raise
            blocks = step
            continue
        FITTED[(card, wanted)] = blocks
        return out
