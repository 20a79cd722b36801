"""What a math-path attention holds: transformers' SDPA path (one call over every query row, the
keys and values copied for grouped query heads) beside the app's (bounded_attention.py: grouped
query heads packed as rows of their KV head, bounded calls), each measured as the peak resident
memory a process grows by while it runs (Linux's VmHWM, reset before the call: a forked
process's ru_maxrss starts at its parent's), beside what the plan counts for the app's
(bounded_attention.attention_bytes). bf16, SDPA held to its math path, as where no fused kernel
takes a pass. One process measures every call in turn, its allocator returning each freed buffer
of 64 KiB or more to the OS (MALLOC_TUNABLES), so that no call reuses memory an earlier one held.

    python scripts/attention_memory.py            # a markdown table
    python scripts/attention_memory.py --json     # one object a shape
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specchat.bounded_attention import attention_bytes, bounded_sdpa, grouped_sdpa

HEAD_DIM = 128
# (query heads, KV heads, query rows, keys): 1.3 GB of scores in one call without grouped heads; the
# embedded 1.5B target (12 query heads on 2) over a 1024-token tree after 4096 tokens
SHAPES = ((16, 16, 1024, 8192), (12, 2, 1025, 5121))
# glibc's allocator with a fixed mmap threshold: every buffer of 64 KiB or more is its own mapping,
# unmapped when freed (the default threshold grows to 32 MiB, and a freed buffer under it stays in
# the heap, where a later call would reuse it unseen)
MALLOC_TUNABLES = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}


class Attention:
    """What the attention interface reads of its module."""

    is_causal, training = True, False

    def __init__(self, groups: int) -> None:
        self.num_key_value_groups = groups


def status_bytes(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM), in bytes."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def grow(heads: int, kv_heads: int, rows: int, keys: int, how: str) -> int:
    """In this process: the bytes its peak grows by over one attention, `how` = transformers or app."""
    query = torch.randn(1, heads, rows, HEAD_DIM, dtype=torch.bfloat16)
    key, value = (torch.randn(1, kv_heads, keys, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    mask = torch.zeros(1, 1, rows, keys, dtype=torch.bfloat16)
    module = Attention(heads // kv_heads)
    attend = sdpa_attention_forward if how == "transformers" else grouped_sdpa if kv_heads < heads else bounded_sdpa
    with sdpa_kernel(SDPBackend.MATH):
        attend(module, query[:, :, :16], key, value, mask[:, :, :16])
        Path("/proc/self/clear_refs").write_text("5")  # the peak back to what is resident now
        start = status_bytes("VmRSS")
        attend(module, query, key, value, mask)
    return status_bytes("VmHWM") - start


def row(heads: int, kv_heads: int, rows: int, keys: int) -> dict:
    """One shape's growth under the app's attention, then transformers', in this process."""
    return {"heads": heads, "kv_heads": kv_heads, "rows": rows, "keys": keys,
            "app_bytes": grow(heads, kv_heads, rows, keys, "app"),
            "transformers_bytes": grow(heads, kv_heads, rows, keys, "transformers"),
            "counted_bytes": attention_bytes(heads, kv_heads, HEAD_DIM, rows, keys, torch.bfloat16.itemsize)}


def measured_rows() -> list[dict]:
    """Every shape's row, measured in a child process whose allocator gives back what it frees."""
    done = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, timeout=900,
                          check=True, env=os.environ | MALLOC_TUNABLES)
    return json.loads(done.stdout)


def table(rows: list[dict]) -> str:
    lines = ["| heads (KV) x rows x keys | transformers MB | the app's MB | the plan counts MB |", "|---|---|---|---|"]
    lines += [f"| {r['heads']} ({r['kv_heads']}) x {r['rows']} x {r['keys']} | {r['transformers_bytes'] / 1e6:.0f} "
              f"| {r['app_bytes'] / 1e6:.0f} | {r['counted_bytes'] / 1e6:.0f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object a shape")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps([row(*shape) for shape in SHAPES]))
        return
    rows = measured_rows()
    print("\n".join(json.dumps(r) for r in rows) if args.json else table(rows))


if __name__ == "__main__":
    main()
