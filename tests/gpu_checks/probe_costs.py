"""The `--budget auto` probe against measured passes: the probe's cost of a target pass over n
tree tokens, at every size it measures, against the same pass timed by the device itself (CUDA
events around it, the clock on a CPU), fastest of RUNS each.

Without a synchronize before its clock reads, the probe would give a CUDA pass the cost of its
kernel launches: nearly flat in n, and far below the measured time once the pass is compute-bound.
"""

from pathlib import Path
from time import perf_counter

import torch
from gpu_checks.tiny_models import wide_checkpoint
from gpu_checks.verdict import Verdict, judged
from transformers import AutoModelForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import CONTEXT, measure

FACTOR = 2.0  # probe / measured within [1 / FACTOR, FACTOR] at every size
CAP = 512  # the largest pass the GPU check probes
RUNS = 5
HEAD_ROWS = 8  # the rows of the LM head a target pass computes for the walk, as the probe does


def device_seconds(lm: CausalLM, n: int) -> float:
    """One target pass over n tokens after CONTEXT cached ones, timed on the device."""
    vocab = lm.model.config.vocab_size
    cache = new_cache()
    lm.hidden(torch.arange(CONTEXT) % vocab, torch.arange(CONTEXT), cache)

    def work() -> None:
        lm.logits(lm.hidden(torch.arange(n) % vocab, torch.arange(CONTEXT, CONTEXT + n), cache)[:HEAD_ROWS])

    if lm.device.type != "cuda":
        start = perf_counter()
        work()
        return perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000  # milliseconds


def measured_seconds(lm: CausalLM, n: int) -> float:
    return min(device_seconds(lm, n) for _ in range(RUNS))


def probe_verdict(check: str, sizes: tuple[int, ...], probed: tuple[float, ...], measured: list[float]) -> Verdict:
    ratios = [p / m for p, m in zip(probed, measured, strict=True)]
    rows = ", ".join(f"n={n}: {p * 1e3:.2f}/{m * 1e3:.2f} ms" for n, p, m in zip(sizes, probed, measured))
    return judged(check, all(1 / FACTOR <= r <= FACTOR for r in ratios),
                  f"probe/measured {rows}; ratios {min(ratios):.2f}..{max(ratios):.2f} "
                  f"(bounds {1 / FACTOR:g}..{FACTOR:g})")


def check_probe(lm: CausalLM, cap: int) -> Verdict:
    sizes, probed, _, _ = measure(lm, cap, run_head=False)
    measured = [measured_seconds(lm, n) for n in sizes]
    return probe_verdict(f"probe vs measured passes ({lm.device.type})", sizes, probed, measured)


def wide_target(device: torch.device, workdir: Path) -> CausalLM:
    """The wide model in memory, in bfloat16: its passes are compute-bound on a GPU from a few
    hundred tokens, where launch-only timing would be furthest off."""
    model = AutoModelForCausalLM.from_pretrained(wide_checkpoint(workdir), dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    return CausalLM(model.to(device).eval())
