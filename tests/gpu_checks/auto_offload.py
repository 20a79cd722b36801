"""`--offload auto` streaming the default pair under a GPU memory budget. The budget is the
smallest `--vram-budget` the plan accepts, tried upward from FIRST_GB in steps of STEP (a refused
budget is one line and loads nothing), so that the device keeps its fixed parts and little more and
the layers stream; the reply must stream and equal the target's greedy reply."""

from collections.abc import Callable

import torch
from gpu_checks.replies import GreedyJudge, Run, generate
from gpu_checks.verdict import Verdict, judged, skipped

from specchat.offload.cuda import free_bytes

FIRST_GB = 0.5
STEP = 1.25  # the budget found is at most 25% over the smallest one accepted
CHECK = "--offload auto under --vram-budget: streams, reply == greedy reply"


def refused(run: Run) -> bool:
    """The plan's one-line refusal of the budget: exit 2, naming --vram-budget."""
    return run.returncode == 2 and "--vram-budget" in run.error


def accepted_budget(attempt: Callable[[float], Run], first: float, step: float, limit: float) -> tuple[float, Run]:
    """The first budget of first, first * step, ... that `attempt` is not refused, and its run;
    past `limit`, the last refusal."""
    budget = first
    run = attempt(budget)
    while refused(run) and budget * step <= limit:
        budget *= step
        run = attempt(budget)
    return budget, run


def check_auto_offload(judge: GreedyJudge, device: torch.device) -> Verdict:
    if device.type != "cuda":
        return skipped(CHECK, "no CUDA device: --vram-budget budgets GPU memory")
    limit = free_bytes(device) / 1e9
    budget, run = accepted_budget(
        lambda gb: generate(judge.workdir, "--offload", "auto", "--vram-budget", f"{gb:.3f}"), FIRST_GB, STEP, limit)
    if run.returncode != 0:
        return judged(CHECK, False, f"--vram-budget {budget:.2f} GB: {run.error}")
    tokens, summary = run.reply["token_ids"], run.reply["summary"]
    comparison = judge.compare(tokens)
    plan = run.line_starting("offload plan: ") or "no plan line"
    return judged(CHECK, summary["transfer_bytes"] > 0 and comparison.acceptable,
                  f"--vram-budget {budget:.2f} GB (smallest accepted, steps of x{STEP:g}); {plan}; streamed "
                  f"{summary['transfer_bytes'] / 1e9:.2f} GB at {summary['transfer_gbps']:.2f} GB/s, stalled "
                  f"{summary['stall_s']:.2f} s, link idle {summary['link_idle']:.0%}; {comparison.describe()}")
