"""Quantized drafts: a SpecExec reply of the default pair with an nf4 draft (bitsandbytes, CUDA
only) and with an int8 draft (`--draft-quant int8`), each judged against the target's greedy
reply. The draft's weights change which tokens are drafted, never which are emitted."""

import importlib.util

import torch
from gpu_checks.replies import GreedyJudge, generate
from gpu_checks.verdict import Verdict, judged, skipped

BUDGET = "64"  # a fixed tree size: the replies do not depend on a timing probe


def bitsandbytes_installed() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def check_draft(kind: str, judge: GreedyJudge, device: torch.device) -> Verdict:
    check = f"{kind} draft: specexec reply == greedy reply ({device.type})"
    if kind == "nf4" and device.type != "cuda":
        return skipped(check, "nf4 runs on CUDA only (bitsandbytes' 4-bit kernels)")
    if kind == "nf4" and not bitsandbytes_installed():
        return skipped(check, "bitsandbytes is not installed: pip install 'specchat[nf4]'")
    run = generate(judge.workdir, "--engine", "specexec", "--draft-quant", kind, "--offload", "none",
                   "--budget", BUDGET)
    if run.returncode != 0:
        return judged(check, False, run.error)
    tokens, summary = run.reply["token_ids"], run.reply["summary"]
    comparison = judge.compare(tokens)
    return judged(check, comparison.acceptable,
                  f"{len(tokens)} tokens, budget {BUDGET}, gen rate {summary['gen_rate']:.2f}: {comparison.describe()}")
