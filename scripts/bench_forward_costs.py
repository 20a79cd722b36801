"""Time one forward of the embedded target or draft over n new tokens after a 100-token context,
per dtype: where a CPU without bf16 hardware spends its time (the trunk, then the LM head over
the few rows a tree pass reads).

Usage: python scripts/bench_forward_costs.py {target,draft} {bf16,fp32}
Prints one row per n in 1, 4, 16, 64, 256: the fastest and the median of 4 runs.
"""

import argparse
import time

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET

CONTEXT = 100
SIZES = (1, 4, 16, 64, 256)
RUNS = 4


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main() -> None:
    parser = argparse.ArgumentParser(description="Time one forward of the embedded target or draft over n tokens.")
    parser.add_argument("model", choices=("target", "draft"))
    parser.add_argument("dtype", choices=tuple(DTYPES))
    options = parser.parse_args()
    which = DEFAULT_TARGET if options.model == "target" else DEFAULT_DRAFT
    lm = CausalLM(load(which, DTYPES[options.dtype], False).model)
    prefix = torch.randint(0, 1000, (CONTEXT,))
    for n in SIZES:
        times = []
        for _ in range(RUNS):
            cache = new_cache()
            lm.hidden(prefix, torch.arange(CONTEXT), cache)
            tokens = torch.randint(0, 1000, (n,))
            start = time.perf_counter()
            hidden = lm.hidden(tokens, torch.arange(CONTEXT, CONTEXT + n), cache)
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
            lm.logits(hidden[: min(n, 8)])
            head = time.perf_counter() - start
        times.sort()
        print(f"{options.model} {options.dtype} N={n}: trunk {1000 * times[0]:.0f} ms "
              f"(median {1000 * times[RUNS // 2]:.0f}), head({min(n, 8)} rows) {1000 * head:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
