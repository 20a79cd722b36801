"""Time a model's q/k/v and gate/up projections in int8, as separate linears and stacked
(quant/stacked.py), over every layer's worth of distinct weights, at the widths a draft step has.

Usage: python scripts/bench_stacked_projections.py [--hidden 1536] [--intermediate 8960]
           [--kv 256] [--layers 28]

The defaults are the embedded 1.5B's shapes (the disk tier's int8 draft). Weights are random:
the kernels' time does not depend on the values. Prints one row per width: the fastest of 3
passes over all layers each (quant.timing, the two in turns), in ms.
"""

import argparse
from functools import partial

import torch
from torch import nn

from specchat.bench.machine import describe_machine
from specchat.quant.int8 import Bank, quantize_linears
from specchat.quant.stacked import stack_projections
from specchat.quant.timing import best_seconds
from specchat.quant.widths import CPU

WIDTHS = (1, 4, 16, 64)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--intermediate", type=int, default=8960)
    parser.add_argument("--kv", type=int, default=256, help="width of the k and v projections")
    parser.add_argument("--layers", type=int, default=28)
    return parser.parse_args()


class Projections(nn.Module):
    """One layer's q/k/v and gate/up projections, called as transformers calls them."""

    def __init__(self, hidden: int, intermediate: int, kv: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, width).bfloat16() for width in (hidden, kv, kv))
        self.gate_proj, self.up_proj = (nn.Linear(hidden, intermediate, bias=False).bfloat16() for _ in range(2))

    def forward(self, x: torch.Tensor) -> None:
        self.q_proj(x), self.k_proj(x), self.v_proj(x)
        self.gate_proj(x), self.up_proj(x)


def int8_layers(args: argparse.Namespace, stacked: bool) -> Bank:
    torch.manual_seed(0)
    layers = Bank([Projections(args.hidden, args.intermediate, args.kv) for _ in range(args.layers)])
    if stacked:
        stack_projections(layers)
    quantize_linears(layers)
    return layers.requires_grad_(False)


def main() -> None:
    args = parse_args()
    separate, stacked = int8_layers(args, stacked=False), int8_layers(args, stacked=True)
    print(f"# {describe_machine()}; {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, kv {args.kv}")
    print("| rows | separate ms | stacked ms | stacked / separate |\n|---|---|---|---|")
    for rows in WIDTHS:
        x = torch.randn(rows, args.hidden).bfloat16()
        apart, together = (1000 * seconds for seconds in best_seconds([partial(separate, x), partial(stacked, x)], CPU))
        print(f"| {rows} | {apart:.3f} | {together:.3f} | {together / apart:.2f} |")


if __name__ == "__main__":
    main()
