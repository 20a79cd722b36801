"""Time one draft-sized linear (896 -> 4864, the embedded 0.5B draft's MLP) dense and in
weight-only int8, per activation dtype and number of rows: what `--draft-quant auto` decides on.

Usage: python scripts/bench_int8_linear.py
Prints one markdown row per rows count: the fastest of the probe's runs for fp32, int8 with
fp32 activations, bf16 and int8 with bf16 activations, and up to how many rows `int8_rows` finds int8 faster, per dtype.
"""

import torch
from torch import nn

from specchat.quant.int8 import PROBE_SHAPE, Int8Linear, int8_rows, seconds

ROWS = (1, 4, 16, 64, 128, 256)


def layers(dtype: torch.dtype) -> tuple[nn.Module, nn.Module]:
    weight = torch.randn(PROBE_SHAPE[1], PROBE_SHAPE[0], generator=torch.Generator().manual_seed(0)).to(dtype)
    dense = nn.Linear(*PROBE_SHAPE, bias=False, dtype=dtype)
    dense.weight.data = weight
    return dense, Int8Linear(weight, None)


def main() -> None:
    fp32, bf16 = layers(torch.float32), layers(torch.bfloat16)
    print("| rows | fp32 ms | int8 (fp32 act.) ms | bf16 ms | int8 (bf16 act.) ms |")
    print("|---|---|---|---|---|")
    for rows in ROWS:
        x = torch.randn(rows, PROBE_SHAPE[0])
        cells = [1000 * seconds(layer, [x.to(dtype)]) for (dense, int8), dtype in ((fp32, torch.float32), (bf16, torch.bfloat16))
                 for layer in (dense, int8)]
        print(f"| {rows} | " + " | ".join(f"{ms:.2f}" for ms in cells) + " |")
    print(f"int8_rows: float32 {int8_rows(torch.float32)}, bfloat16 {int8_rows(torch.bfloat16)}")


if __name__ == "__main__":
    main()
