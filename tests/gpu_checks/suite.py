"""Every check of the GPU check in the order the table lists them, and running them: a check that
raises is reported, its traceback on stderr and a FAIL line in the table, and the others still
run."""

import gc
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_checks.auto_offload import check_auto_offload
from gpu_checks.bandwidth import check_bandwidth
from gpu_checks.capture_beside_loads import check_capture_beside_loads
from gpu_checks.captured_draft import check_captured_draft
from gpu_checks.drafts import check_draft
from gpu_checks.dsi_captured import check_dsi_captured
from gpu_checks.expanded_specexec import check_expanded_specexec
from gpu_checks.moe_streamed import check_moe_streamed
from gpu_checks.probe_costs import CAP, check_probe, wide_target
from gpu_checks.replies import GreedyJudge
from gpu_checks.streamed_logits import check_gptq_streamed, check_ring_reuse
from gpu_checks.verdict import Verdict

Check = tuple[str, Callable[[], Verdict]]  # a name for the table if it raises, and the check


def all_checks(device: torch.device, workdir: Path) -> list[Check]:
    judge = GreedyJudge(workdir)  # the default pair's greedy reply, made once for three checks
    return [
        ("ring reuse, llama", lambda: check_ring_reuse("llama", 2, device, workdir)),
        ("ring reuse, qwen2", lambda: check_ring_reuse("qwen2", 3, device, workdir)),
        ("GPTQ streamed from RAM", lambda: check_gptq_streamed("ram", device, workdir)),
        ("GPTQ streamed from disk", lambda: check_gptq_streamed("disk", device, workdir)),
        ("MoE streamed by expert from RAM", lambda: check_moe_streamed("ram", device, workdir)),
        ("MoE streamed by expert from disk", lambda: check_moe_streamed("disk", device, workdir)),
        ("bf16 GPTQ SpecExec, wide passes expanded", lambda: check_expanded_specexec(device, workdir)),
        ("captured draft step", lambda: check_captured_draft(device)),
        ("captured int4 draft step", lambda: check_captured_draft(device, "int4")),
        ("captured fp8 draft step", lambda: check_captured_draft(device, "fp8")),
        ("captured fp8 draft step, its embedding on the host",
         lambda: check_captured_draft(device, "fp8", hosted=True)),
        ("DSI beside the captured draft step", lambda: check_dsi_captured(device)),
        ("draft captures beside the streamer's loads", lambda: check_capture_beside_loads(device)),
        ("nf4 draft", lambda: check_draft("nf4", judge, device)),
        ("int8 draft", lambda: check_draft("int8", judge, device)),
        ("probe vs measured passes", lambda: check_probe(wide_target(device, workdir), CAP)),
        ("--offload auto under --vram-budget", lambda: check_auto_offload(judge, device)),
        ("pinned host->device bandwidth", lambda: check_bandwidth(device, workdir)),
    ]


def run_all(checks: list[Check], report: Callable[[Verdict], None]) -> list[Verdict]:
    verdicts = []
    for name, check in checks:
        try:
            verdict = check()
        except Exception as error:  # reported: the traceback here, a FAIL in the table
            traceback.print_exc()
            verdict = Verdict(name, "FAIL", f"raised {type(error).__name__}: {error}")
        finally:
            release_memory()
        verdicts.append(verdict)
        report(verdict)
    return verdicts


def release_memory() -> None:
    """Give back what a check's models held before the next one measures free GPU memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
