"""Time the default target's linears (Qwen2.5-Coder-1.5B) dense and packed in int4, per rows.

Usage: python scripts/bench_int4_linear.py [--shapes 1536x8960 ...] [--rows 1 4 ...] [--threads N] [--inductor]
Prints one markdown row per (shape, rows): ms per call for a bf16 and a float32 dense matmul,
torch's fused int4 kernel, the chunked-dequantization product (bf16 input, groups of 32 as
GGUF Q4_K's; the chunked product in the dtype quant/widths.py picks) and the dense copy an in-memory
target keeps for tree passes (quant/int4_dense.py: prepacked for oneDNN where that pays), and with
--inductor the fused kernel's op compiled by torch.compile under max-autotune (on a CPU with AMX,
inductor's C++ template dequantizes weight tiles in cache and multiplies every row with AMX; it is
compiled per rows count, as inductor takes that template only for a static row count), each
also as a ratio to dense bf16 in the same run; then the probe's width choice and, per shape, the
width from which an Int4Linear multiplies its dense copy. A call is timed once; calls under
REPEAT_UNDER_S run REPEATS times more and the fastest counts (shorter runs are noisier).
"""

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from specchat.quant.int4_chunks import chunked_linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import fused_linear, pack
from specchat.quant.widths import dense_copy_linear, dense_rows, width_choice

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


class FusedOp(nn.Module):
    """The fused kernel's op over weights held as buffers, which inductor's freezing treats as
    constants (its int4 template needs them so)."""

    def __init__(self, packed: Tensor, scales_and_zeros: Tensor) -> None:
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_and_zeros)


def inductor_linear(packed: Tensor, scales_and_zeros: Tensor) -> Callable[[Tensor], Tensor]:
    """The op compiled with inductor's C++ GEMM templates in the running (max-autotune, freezing);
    a new rows count compiles again."""
    import torch._inductor.config as inductor

    inductor.max_autotune, inductor.freezing, inductor.max_autotune_gemm_backends = True, True, "CPP,ATEN"
    torch._dynamo.reset()  # past its recompile limit (8) dynamo would run the op eagerly
    return torch.compile(FusedOp(packed, scales_and_zeros).eval(), dynamic=False)


def bench_shape(in_features: int, out_features: int, rows_list: list[int], product: torch.dtype,
                inductor: bool = False) -> None:
    generator = torch.Generator().manual_seed(0)
    dense = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
    dense_bf16 = dense.bfloat16()
    packed = pack(torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator), CPU)
    scales_and_zeros = (torch.rand(in_features // GROUP, out_features, 2, generator=generator) / 64).bfloat16()
    layout = layout_for(CPU, in_features)
    copy = dense_copy_linear(dense_bf16)
    compiled = inductor_linear(packed, scales_and_zeros) if inductor else None
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
        if compiled is not None:
            with torch.inference_mode():
                compiled(x_bf16)  # compiles for this rows count
                cells.append(milliseconds(lambda: compiled(x_bf16)))
        ratios = " | ".join(f"{ms:.3f} ({ms / cells[0]:.2f}x)" for ms in cells[1:])
        print(f"| {in_features} x {out_features} | {rows} | {cells[0]:.3f} | {ratios} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=[f"{i}x{o}" for i, o in SHAPES], help="in x out")
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch's threads (1 keeps a busy machine's timings steady)")
    parser.add_argument("--inductor", action="store_true",
                        help="add the fused op compiled by inductor (needs a C++ compiler; its cache is a temporary folder)")
    args = parser.parse_args()
    if args.inductor:
        # inductor's caches (precompiled headers too, which ignore TORCHINDUCTOR_CACHE_DIR) go under
        # the temporary folder, removed when the script ends
        cache = tempfile.TemporaryDirectory(prefix="bench-int4-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.tempdir = cache.name
    torch.set_num_threads(args.threads)
    choice = width_choice("cpu", torch.bfloat16)
    print(f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
          f"chunked product in {choice.product}")
    inductor_column = " inductor int4 ms (/bf16) |" if args.inductor else ""
    print("| in x out | rows | bf16 dense ms | float32 dense ms (/bf16) | int4 fused ms (/bf16) | "
          f"int4 chunked ms (/bf16) | dense copy ms (/bf16) |{inductor_column}")
    print("|---|---|---|---|---|---|---|" + "---|" * args.inductor)
    for shape in args.shapes:
        in_features, out_features = map(int, shape.split("x"))
        bench_shape(in_features, out_features, args.rows, choice.product, args.inductor)
    print(f"probe: fused kernel up to {choice.fused_rows} rows, chunked above")
    for shape in args.shapes:
        in_features, out_features = map(int, shape.split("x"))
        print(f"{shape}: dense copy from {dense_rows(in_features, out_features, torch.bfloat16)} rows")


if __name__ == "__main__":
    main()
