"""CUDA's int4 expansion (quant/int4_expand.py) at a 70B target's shapes: first bitwise against its
torch reference, then the kernel's block sizes and warps, and the wide product's chunk size, swept,
beside the fused int4 kernel and a dense bf16 matmul over a weight of the same shape. Figures in ms,
the fastest of RUNS timed with CUDA events after a warm-up. Needs a CUDA device and Triton.

    python scripts/bench_int4_expand.py                          # the whole sweep at 70B shapes
    python scripts/bench_int4_expand.py --kernel-only --shapes 2   # the kernel's blocks, the 2 largest
"""

import argparse
import itertools
import math
from collections.abc import Callable

import torch
import triton

from specchat.quant import int4_expand
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import fused_linear, pack

RUNS = 5
SHAPES = ((8192, 28672), (8192, 8192), (28672, 8192), (8192, 1024))  # (in, out) of a Llama-2-70B layer
GROUP = 256  # what GPTQ's group -1 runs in (quant/int4_gptq.spec_group_size)
ROWS = (256, 1024, 2048)
BLOCKS = ((8, 128), (16, 64), (16, 128), (16, 256), (32, 128), (64, 128), (32, 256))  # (BLOCK_O, BLOCK_I)
WARPS = (2, 4, 8)
CHUNKS = (1 << 25, 1 << 26, 1 << 27, 1 << 28)  # EXPAND_WEIGHTS


def best_ms(run: Callable[[], object]) -> float:
    run()
    best = math.inf
    for _ in range(RUNS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return best


def random_weight(in_features: int, out_features: int, device: torch.device):
    generator = torch.Generator().manual_seed(0)
    nibbles = torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator)
    scales_and_zeros = (torch.rand(in_features // GROUP, out_features, 2, generator=generator) / 64)
    return pack(nibbles, device), scales_and_zeros.to(device, torch.bfloat16), layout_for(device, in_features)


def launch(packed, scales_and_zeros, layout, out, block_o: int, block_i: int, warps: int) -> None:
    """expand_int4 into `out` with the kernel's blocks and warps set to these (module settings)."""
    int4_expand.BLOCK_O, int4_expand.BLOCK_I, int4_expand.WARPS = block_o, block_i, warps
    int4_expand.expand_int4(packed, scales_and_zeros, GROUP, layout, torch.bfloat16, out=out)


def check_bitwise(device: torch.device) -> None:
    for in_features, out_features in ((8192, 28672), (512, 256)):
        packed, scales_and_zeros, layout = random_weight(in_features, out_features, device)
        print(f"layout at in={in_features}: tiles {layout.rows} x {layout.cols}", flush=True)
        got = int4_expand.expand_int4(packed, scales_and_zeros, GROUP, layout, torch.bfloat16)
        want = int4_expand.expand_int4_reference(packed, scales_and_zeros, GROUP, layout, torch.bfloat16)
        same = torch.equal(got.view(torch.int16), want.view(torch.int16))
        print(f"bitwise {in_features}x{out_features}: {same}; max |diff| {(got.float() - want.float()).abs().max():.3g}",
              flush=True)
        del got, want


def sweep_kernel(device: torch.device, shapes: tuple[tuple[int, int], ...]) -> None:
    """The kernel's time per block and warps; the module's settings restored after (the products use them)."""
    settings = int4_expand.BLOCK_O, int4_expand.BLOCK_I, int4_expand.WARPS
    try:
        sweep_blocks(device, shapes)
    finally:
        int4_expand.BLOCK_O, int4_expand.BLOCK_I, int4_expand.WARPS = settings


def sweep_blocks(device: torch.device, shapes: tuple[tuple[int, int], ...]) -> None:
    print("| in x out | BLOCK_O | BLOCK_I | warps | expand ms | GB/s written |", flush=True)
    for in_features, out_features in shapes:
        packed, scales_and_zeros, layout = random_weight(in_features, out_features, device)
        out = torch.empty(out_features, in_features, dtype=torch.bfloat16, device=device)
        for (block_o, block_i), warps in itertools.product(BLOCKS, WARPS):
            seconds = best_ms(lambda: launch(packed, scales_and_zeros, layout, out, block_o, block_i, warps))
            print(f"| {in_features}x{out_features} | {block_o} | {block_i} | {warps} | {seconds:.3f} | "
                  f"{out.numel() * 2 / seconds / 1e6:.0f} |", flush=True)
        del out


def sweep_products(device: torch.device, shapes: tuple[tuple[int, int], ...]) -> None:
    print("| in x out | rows | dense ms | fused ms | " + " | ".join(f"chunk 2^{c.bit_length() - 1} ms" for c in CHUNKS)
          + " |", flush=True)
    for in_features, out_features in shapes:
        packed, scales_and_zeros, layout = random_weight(in_features, out_features, device)
        dense = torch.randn(out_features, in_features, device=device, dtype=torch.bfloat16)
        for rows in ROWS:
            x = torch.randn(rows, in_features, device=device, dtype=torch.bfloat16)
            cells = [best_ms(lambda: torch.nn.functional.linear(x, dense)),
                     best_ms(lambda: fused_linear(x, packed, scales_and_zeros, GROUP))]
            for chunk in CHUNKS:
                int4_expand.EXPAND_WEIGHTS = chunk
                cells.append(best_ms(lambda: int4_expand.expanded_linear(x, packed, scales_and_zeros, GROUP, layout)))
            print(f"| {in_features}x{out_features} | {rows} | " + " | ".join(f"{c:.3f}" for c in cells) + " |",
                  flush=True)
        del dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-only", action="store_true", help="the kernel's blocks and warps, not the products")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N of the 70B shapes")
    options = parser.parse_args()
    shapes = SHAPES[:options.shapes]
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    check_bitwise(device)
    sweep_kernel(device, shapes)
    if not options.kernel_only:
        sweep_products(device, shapes)


if __name__ == "__main__":
    main()
