"""Per-token cost of the embedded target at 100 and 4,000 tokens of context, with transformers'
concatenating DynamicCache ("concat", the cache before issue 14) and specchat's preallocated
SlotCache ("slots"), side by side in one run.

Two steps are timed after the context is prefilled:
- decode: one token (the autoregressive step);
- tree16: a 16-node chain pass with its tree mask, then pruning to the first 4 nodes (a tree
  engine's target pass and prune).
Usage: python scripts/bench_kv_decode.py [bf16|fp32] [steps]
Prints one row per (context, cache, step): the median and the fastest of `steps` timings.
"""

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_TARGET

CONTEXTS = (100, 4000)
TREE = 16
KEPT = 4


def concat_keep(cache: DynamicCache, keep: torch.Tensor) -> None:
    """The pruning of the cache before issue 14: one index_select of every layer's whole cache."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(-2, keep)
        layer.values = layer.values.index_select(-2, keep)


def slots_keep(cache, keep: torch.Tensor) -> None:
    for layer in cache.layers:
        layer.keep(keep)


def time_steps(lm: CausalLM, cache, context: int, steps: int, tree: bool, keep) -> list[float]:
    times = []
    for step in range(steps):
        n = TREE if tree else 1
        tokens = torch.randint(0, 1000, (n,))
        length = cache.get_seq_length()
        mask = torch.cat([torch.ones(n, length, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1)
        start = time.perf_counter()
        lm.hidden(tokens, torch.arange(length, length + n), cache, mask if tree else None)
        if tree:
            keep(cache, torch.cat([torch.arange(length), length + torch.arange(KEPT)]))
        times.append(time.perf_counter() - start)
    return times


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main() -> None:
    parser = argparse.ArgumentParser(description="Time decode and tree steps over the two KV caches.")
    parser.add_argument("dtype", nargs="?", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("steps", nargs="?", type=int, default=20, help="steps timed per row (default 20)")
    options = parser.parse_args()
    dtype, steps = DTYPES[options.dtype], options.steps
    lm = CausalLM(load(DEFAULT_TARGET, dtype, False).model)
    torch.manual_seed(0)
    print(f"target {DEFAULT_TARGET} {dtype}, threads {torch.get_num_threads()}, {steps} steps per row", flush=True)
    for context in CONTEXTS:
        prefix = torch.randint(0, 1000, (context,))
        for name, make, keep in (("concat", DynamicCache, concat_keep), ("slots", new_cache, slots_keep)):
            for tree in (False, True):
                cache = make()
                lm.hidden(prefix, torch.arange(context), cache)
                times = time_steps(lm, cache, context, steps, tree, keep)
                step = f"tree{TREE}" if tree else "decode"
                print(f"context {context:>5}  {name:<6}  {step:<7}  median {1000 * statistics.median(times):7.1f} ms  "
                      f"min {1000 * min(times):7.1f} ms", flush=True)


if __name__ == "__main__":
    main()
