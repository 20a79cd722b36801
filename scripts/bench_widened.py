"""The embedded target's passes with its dense products as this CPU chooses them against the same
target without: bf16 widened to float32 (quant/widened.py), what a CPU without bf16 instructions
gains on wide passes; float32 through oneDNN (quant/onednn_float.py), what MKL's few-row products lose.

    python scripts/bench_widened.py [--dtype bfloat16|float32] [--sizes 1,4,16,64,256] [--prefill 512]
        [--runs 3] [--target qwen2.5-coder-1.5b] [--weights quantized]

Two copies of the target in --dtype, as load_local_models prepares it on this machine (in bf16 the
4-bit target without the 4-bit linears' dense copies, which are not widened and which a CPU without
bf16 instructions does not keep): its dense linears (in bf16 the LM head and 14 layers' Q6_K down and
v; in float32 every linear) widened or routed over this CPU's measured rows ("chosen"), or plain
(what the code did before). Per size n: one forward of n new tokens after a 100-token context (the
trunk), then the LM head over those n rows; and a prefill of --prefill tokens from nothing. The two
copies alternate run by run; each cell is the fastest of --runs, in ms, then chosen / plain.
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
from specchat.quant.onednn_float import OneDnnLinear, route_float32_linears
from specchat.quant.prepacked import prepack_linears, widen_linears
from specchat.quant.widened import WidenedLinear, widened_rows

CONTEXT = 100
CPU = torch.device("cpu")


def prepared(target: str, weights: str, dtype: torch.dtype, chosen: bool) -> CausalLM:
    """The target as load_local_models prepares it in memory, its plain linears as chosen here or not."""
    model = load(target, dtype, False, weights=weights).model
    prepack_linears(model)
    if chosen:
        widen_linears(model.modules(), CPU, dtype)
        route_float32_linears(model.modules(), CPU)
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
    parser = argparse.ArgumentParser(description="Passes of the embedded target, this CPU's products against plain.")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--sizes", type=lambda text: [int(n) for n in text.split(",")], default=[1, 4, 16, 64, 256])
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--weights", choices=("quantized", "dense"), default="quantized")
    options = parser.parse_args()
    dtype = getattr(torch, options.dtype)
    print(f"{describe_machine()}; bf16 widened from {widened_rows(torch.bfloat16)} rows")
    targets = {name: prepared(options.target, options.weights, dtype, name == "chosen") for name in ("chosen", "plain")}
    modules = list(targets["chosen"].model.modules())
    routed = [m for m in modules if isinstance(m, OneDnnLinear)]
    print(f"linears widened: {sum(isinstance(m, WidenedLinear) for m in modules)}, through oneDNN: {len(routed)} "
          f"(rows {sorted({(m.in_features, m.out_features, m.rows) for m in routed})}: in, out, span)")
    print("| pass | chosen ms | plain ms | chosen / plain |\n|---|---|---|---|")
    shapes = [(f"trunk n={n} after {CONTEXT}", n, CONTEXT) for n in options.sizes]
    shapes.append((f"prefill {options.prefill}", options.prefill, 0))
    for label, n, context in shapes:
        runs = {name: [] for name in targets}
        for _ in range(options.runs):
            for name, lm in targets.items():
                runs[name].append(pass_seconds(lm, n, context))
        mine, plain = best(runs["chosen"]), best(runs["plain"])
        print(row(label, *(x[0] for x in (mine, plain))), flush=True)
        if context and n > 1:
            print(row(f"head over those {n} rows", mine[1], plain[1]), flush=True)

if __name__ == "__main__":
    main()
