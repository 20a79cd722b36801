"""What a math-path attention holds: one SDPA call over every query row beside bounded_attention's
calls, each measured as the peak resident memory a fresh process grows by while it runs (Linux's
VmHWM, reset before the call: a forked process's ru_maxrss starts at its parent's), beside what the
plan counts for the bounded calls (bounded_attention.attention_bytes; without
grouped heads, no copies of keys and values). bf16, SDPA held to its math path, as where no fused
kernel takes a pass.

    python scripts/attention_memory.py            # a markdown table
    python scripts/attention_memory.py --json     # one object a shape
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specchat.bounded_attention import attention_bytes, bounded_sdpa

HEAD_DIM = 64
# (heads, query rows, keys): one call of 1.3 GB of scores; the embedded 1.5B target's 12 heads over
# a 1024-token tree after 4096 tokens
SHAPES = ((16, 1024, 8192), (12, 1025, 5121))


class Attention:
    """What the attention interface reads of its module: no grouped heads."""

    num_key_value_groups, is_causal, training = 1, True, False


def status_bytes(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM), in bytes."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def grow(heads: int, rows: int, keys: int, how: str) -> int:
    """In this process: the bytes its peak grows by over one attention, `how` = whole or bounded."""
    query = torch.randn(1, heads, rows, HEAD_DIM, dtype=torch.bfloat16)
    key, value = (torch.randn(1, heads, keys, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    mask = torch.zeros(1, 1, rows, keys, dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.MATH):
        torch.nn.functional.scaled_dot_product_attention(query[:, :, :16], key, value, attn_mask=mask[:, :, :16])
        Path("/proc/self/clear_refs").write_text("5")  # the peak back to what is resident now
        start = status_bytes("VmRSS")
        if how == "bounded":
            bounded_sdpa(Attention(), query, key, value, mask)
        else:
            torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return status_bytes("VmHWM") - start


def measured(heads: int, rows: int, keys: int, how: str) -> int:
    """`grow` in a fresh process: a peak is a process's high-water mark."""
    done = subprocess.run([sys.executable, __file__, "--child", how, str(heads), str(rows), str(keys)],
                          capture_output=True, text=True, timeout=600, check=True)
    return int(done.stdout.split()[-1])


def row(heads: int, rows: int, keys: int) -> dict:
    scores = heads * rows * keys
    whole = measured(heads, rows, keys, "whole")
    return {"heads": heads, "rows": rows, "keys": keys, "whole_bytes": whole, "bytes_per_score": whole / scores,
            "bounded_bytes": measured(heads, rows, keys, "bounded"),
            "counted_bytes": attention_bytes(heads, heads, HEAD_DIM, rows, keys, torch.bfloat16.itemsize)}


def table(rows: list[dict]) -> str:
    lines = ["| heads x rows x keys | one call MB | bytes a score | bounded calls MB | the plan counts MB |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['heads']} x {r['rows']} x {r['keys']} | {r['whole_bytes'] / 1e6:.0f} | {r['bytes_per_score']:.1f} "
              f"| {r['bounded_bytes'] / 1e6:.0f} | {r['counted_bytes'] / 1e6:.0f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object a shape")
    parser.add_argument("--child", nargs=4, metavar=("HOW", "HEADS", "ROWS", "KEYS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        how, *sizes = args.child
        print(grow(*map(int, sizes), how))
        return
    rows = [row(*shape) for shape in SHAPES]
    print("\n".join(json.dumps(r) for r in rows) if args.json else table(rows))


if __name__ == "__main__":
    main()
