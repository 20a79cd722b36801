"""The embedded target's bf16 passes with its dense products widened to float32 (quant/widened.py)
against the same target without: what a CPU without bf16 instructions gains on wide passes.

    python scripts/bench_widened.py [--sizes 1,4,16,64,256] [--prefill 512] [--runs 3]
        [--target qwen2.5-coder-1.5b] [--weights quantized]

Two copies of the 4-bit target in bf16, as load_local_models prepares it on this machine (without
the 4-bit linears' dense copies, which are not widened and which a CPU without bf16 instructions
does not keep): its dense linears (the LM head, 14 layers' Q6_K down and v) widened from this CPU's
measured rows, or plain (what the code did before). Per size n: one forward of n new tokens after
a 100-token context (the trunk), then the LM head over those n rows; and a prefill of --prefill
tokens from nothing. The two copies alternate run by run; each cell is the fastest of --runs, in
ms, then widened / plain.
"""

import argparse
import time
from collections.abc import Callable

import torch

from specchat.bench.machine import describe_machine
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_TARGET
from specchat.quant.prepacked import prepack_linears, widen_linears
from specchat.quant.widened import WidenedLinear, widened_rows

CONTEXT = 100
CPU = torch.device("cpu")


def prepared(target: str, weights: str, widened: bool) -> CausalLM:
    """The target as load_local_models prepares it in memory, its plain linears widened or not."""
    model = load(target, torch.bfloat16, False, weights=weights).model
    prepack_linears(model)
    if widened:
        widen_linears(model.modules(), CPU, torch.bfloat16)
    return CausalLM(model)


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@torch.inference_mode()
def pass_seconds(lm: CausalLM, n: int, context: int) -> tuple[float, float]:
    """One forward of n tokens after `context` tokens, then the head over its n rows."""
    cache = new_cache()
    if context:
        lm.hidden(torch.randint(0, 1000, (context,)), torch.arange(context), cache)
    tokens = torch.randint(0, 1000, (n,))
    hidden = None

    def trunk() -> None:
        nonlocal hidden
        hidden = lm.hidden(tokens, torch.arange(context, context + n), cache)
    return timed(trunk), timed(lambda: lm.logits(hidden))


def best(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(p[0] for p in pairs), min(p[1] for p in pairs)


def row(label: str, mine: float, plain: float) -> str:
    return f"| {label} | {1000 * mine:.0f} | {1000 * plain:.0f} | {mine / plain:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description="bf16 passes of the embedded target, widened against plain.")
    parser.add_argument("--sizes", type=lambda text: [int(n) for n in text.split(",")], default=[1, 4, 16, 64, 256])
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--weights", choices=("quantized", "dense"), default="quantized")
    options = parser.parse_args()
    print(f"{describe_machine()}; bf16 widened from {widened_rows(torch.bfloat16)} rows")
    targets = {name: prepared(options.target, options.weights, name == "widened") for name in ("widened", "plain")}
    print(f"linears widened: {sum(isinstance(m, WidenedLinear) for m in targets['widened'].model.modules())}")
    print("| pass | widened ms | plain ms | widened / plain |\n|---|---|---|---|")
    shapes = [(f"trunk n={n} after {CONTEXT}", n, CONTEXT) for n in options.sizes]
    shapes.append((f"prefill {options.prefill}", options.prefill, 0))
    for label, n, context in shapes:
        runs = {name: [] for name in targets}
        for _ in range(options.runs):
            for name, lm in targets.items():
                runs[name].append(pass_seconds(lm, n, context))
        mine, plain = best(runs["widened"]), best(runs["plain"])
        print(row(label, *(x[0] for x in (mine, plain))), flush=True)
        if context and n > 1:
            print(row(f"head over those {n} rows", mine[1], plain[1]), flush=True)


if __name__ == "__main__":
    main()
