"""Time draft-sized linears (896 -> 4864, the embedded 0.5B draft's MLP) dense and in int8, per
number of rows: what `--draft-quant auto` decides on.

Usage: python scripts/bench_int8_linear.py
Prints one markdown row per rows count: ms per linear (the fastest of the probe's runs over
INT8_LINEARS distinct weights, so they are read from memory) for fp32, bf16, int8 on fbgemm's
dynamic kernel (x86 CPUs) and weight-only int8 with bf16 activations; then up to how many rows
`int8_rows` finds int8 faster, per dtype.
"""

from functools import partial

import torch

from specchat.quant.int8 import Bank, Int8Linear, dense_linear
from specchat.quant.widths import CPU, INT8_LINEARS, INT8_SHAPE, int8_rows
from specchat.quant.timing import best_seconds

ROWS = (1, 4, 16, 64, 128, 256)


def weights(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(INT8_SHAPE.out_features, INT8_SHAPE.in_features, generator=generator).to(dtype)
            for _ in range(INT8_LINEARS)]


def main() -> None:
    fp32, bf16 = weights(torch.float32), weights(torch.bfloat16)
    banks = [(Bank([dense_linear(w) for w in fp32]), torch.float32), (Bank([dense_linear(w) for w in bf16]), torch.bfloat16),
             (Bank([Int8Linear(w, None) for w in bf16]), torch.bfloat16), (Bank([Int8Linear(w, None, dynamic=False) for w in bf16]), torch.bfloat16)]
    print("| rows | fp32 ms | bf16 ms | int8 dynamic ms | int8 weight-only (bf16 act.) ms |")
    print("|---|---|---|---|---|")
    for rows in ROWS:
        x = torch.randn(rows, INT8_SHAPE.in_features)
        runs = [partial(bank, x.to(dtype)) for bank, dtype in banks]  # timed in turns, as the probe times
        cells = [1000 * seconds / INT8_LINEARS for seconds in best_seconds(runs, CPU)]
        print(f"| {rows} | " + " | ".join(f"{ms:.2f}" for ms in cells) + " |")
    print(f"int8_rows: float32 {int8_rows(torch.float32)}, bfloat16 {int8_rows(torch.bfloat16)}")


if __name__ == "__main__":
    main()
