"""The embedded target's attention (12 query heads on 2 KV heads, 128 dimensions, bf16) over a tree
pass, as transformers runs it (keys and values copied for the query heads) and as the app does
(bounded_attention.py: the query heads packed as rows of their KV head), on the default SDPA path:
the fastest of alternating trials of each, their ratio, and how far apart their outputs are.

    python scripts/bench_attention.py                       # the tree widths of a CPU's passes
    python scripts/bench_attention.py --shapes 64:400 --trials 5
"""

import argparse
from time import perf_counter

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specchat.bounded_attention import grouped_sdpa

HEADS, KV_HEADS, HEAD_DIM = 12, 2, 128
SHAPES = "16:400,64:400,256:4353"  # rows:keys; a small tree early in a chat, a wider one, a 256-token tree at 4096


class Attention:
    """What the attention interface reads of its module."""

    num_key_value_groups, is_causal, training = HEADS // KV_HEADS, True, False


def timed(attend, inputs: tuple[torch.Tensor, ...]) -> float:
    started = perf_counter()
    attend(Attention(), *inputs)
    return perf_counter() - started


def row(rows: int, keys: int, trials: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, HEADS, rows, HEAD_DIM, generator=generator).bfloat16()
    key, value = (torch.randn(1, KV_HEADS, keys, HEAD_DIM, generator=generator).bfloat16() for _ in range(2))
    mask = torch.where(torch.rand(1, 1, rows, keys, generator=generator) < 0.5, 0.0, float("-inf")).bfloat16()
    mask[..., 0] = 0.0  # every row sees something
    inputs = (query, key, value, mask)
    copied, packed = [], []
    for _ in range(trials + 1):  # the first of each warms up
        copied.append(timed(sdpa_attention_forward, inputs))
        packed.append(timed(grouped_sdpa, inputs))
    apart = (sdpa_attention_forward(Attention(), *inputs)[0].float() - grouped_sdpa(Attention(), *inputs)[0].float())
    return {"rows": rows, "keys": keys, "transformers_ms": min(copied[1:]) * 1e3, "packed_ms": min(packed[1:]) * 1e3,
            "apart": apart.abs().max().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help=f"rows:keys, comma-separated (default {SHAPES})")
    parser.add_argument("--trials", type=int, default=20, help="timed calls of each (default 20)")
    args = parser.parse_args()
    print(f"| rows x keys | transformers ms | packed ms | packed / transformers | apart (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads) |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        r = row(*map(int, shape.split(":")), args.trials)
        print(f"| {r['rows']} x {r['keys']} | {r['transformers_ms']:.3f} | {r['packed_ms']:.3f} | "
              f"{r['packed_ms'] / r['transformers_ms']:.2f}x | {r['apart']:.1e} |")


if __name__ == "__main__":
    main()
