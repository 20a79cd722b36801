"""Time the default target's linears (Qwen2.5-Coder-1.5B) dense and packed in int4, per rows.

Usage: python scripts/bench_int4_linear.py [--shapes 1536x8960 ...] [--rows 1 4 ...] [--threads N]
Prints one markdown row per (shape, rows): ms per call for a bf16 and a float32 dense matmul,
torch's fused int4 kernel, the chunked-dequantization product (bf16 input, groups of 32 as
GGUF Q4_K's; the chunked product in the dtype int4_probe picks) and the dense copy an in-memory
target keeps for tree passes (quant/int4_dense.py: prepacked for oneDNN where that pays), each
also as a ratio to dense bf16 in the same run; then the probe's width choice and, per shape, the
width from which an Int4Linear multiplies its dense copy. A call is timed once; calls under
REPEAT_UNDER_S run REPEATS times more and the fastest counts (shorter runs are noisier).
"""

import argparse
import time
from collections.abc import Callable

import torch

from specchat.quant.int4_chunks import chunked_linear
from specchat.quant.int4_dense import dense_linear, dense_rows
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import pack
from specchat.quant.int4_probe import fused_linear, width_choice

SHAPES = ((1536, 1536), (1536, 256), (1536, 8960), (8960, 1536), (1536, 151936))  # (in, out); the last: LM head
ROWS = (1, 4, 16, 64, 256)
GROUP = 32
REPEATS = 3
REPEAT_UNDER_S = 0.5
CPU = torch.device("cpu")


def milliseconds(run: Callable[[], torch.Tensor]) -> float:
    start = time.perf_counter()
    run()
    best = time.perf_counter() - start
    if best < REPEAT_UNDER_S:
        for _ in range(REPEATS):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
    return 1000 * best


def bench_shape(in_features: int, out_features: int, rows_list: list[int], product: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    dense = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
    dense_bf16 = dense.bfloat16()
    packed = pack(torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator), CPU)
    scales_and_zeros = (torch.rand(in_features // GROUP, out_features, 2, generator=generator) / 64).bfloat16()
    layout = layout_for(CPU, in_features)
    copy = dense_linear(dense_bf16)
    for rows in rows_list:
        x = torch.randn(rows, in_features, generator=generator)
        x_bf16 = x.bfloat16()
        cells = [
            milliseconds(lambda: x_bf16 @ dense_bf16.t()),
            milliseconds(lambda: x @ dense.t()),
            milliseconds(lambda: fused_linear(x_bf16, packed, scales_and_zeros, GROUP)),
            milliseconds(lambda: chunked_linear(x_bf16, packed, scales_and_zeros, GROUP, layout, product)),
            milliseconds(lambda: copy(x_bf16)),
        ]
        ratios = " | ".join(f"{ms:.3f} ({ms / cells[0]:.2f}x)" for ms in cells[1:])
        print(f"| {in_features} x {out_features} | {rows} | {cells[0]:.3f} | {ratios} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=[f"{i}x{o}" for i, o in SHAPES], help="in x out")
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch's threads (1 keeps a busy machine's timings steady)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    choice = width_choice("cpu", torch.bfloat16)
    print(f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
          f"chunked product in {choice.product}")
    print("| in x out | rows | bf16 dense ms | float32 dense ms (/bf16) | int4 fused ms (/bf16) | "
          "int4 chunked ms (/bf16) | dense copy ms (/bf16) |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        in_features, out_features = map(int, shape.split("x"))
        bench_shape(in_features, out_features, args.rows, choice.product)
    print(f"probe: fused kernel up to {choice.fused_rows} rows, chunked above")
    for shape in args.shapes:
        in_features, out_features = map(int, shape.split("x"))
        print(f"{shape}: dense copy from {dense_rows(in_features, out_features, torch.bfloat16)} rows")


if __name__ == "__main__":
    main()
