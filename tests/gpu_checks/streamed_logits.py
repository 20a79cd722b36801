"""A model streamed through a ring smaller than a pass, over several passes (one tree-masked):
its logits against the same checkpoint held whole on the same device.

- ring reuse: small Llama and Qwen2 models, every layer streamed from pinned RAM through 2 or 3
  slots, against transformers' own model;
- GPTQ: a 4-bit GPTQ checkpoint streamed packed from pinned RAM or from the disk file, two layers
  resident, against specchat's in-memory GPTQ model.
"""

from pathlib import Path

import torch
from gpu_checks import passes
from gpu_checks.tiny_models import LAYERS, gptq_checkpoint, small_checkpoint
from gpu_checks.verdict import Verdict, judged
from helpers.planned import offload_planned
from transformers import AutoModelForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.offload.build import Offload, offload_model
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter

# float32 (TF32 off, torch's default for matmuls): both sides run the same kernels over the same
# weights, only from other buffers. Largest logit differences measured: on an H200, 2026-11-26, 0
# in all four checks (docs/bench/gpu-2026-11-26-h200/gpu-check.log); on the project's AMD EPYC,
# 2026-11-28, GPTQ 0 (RAM and disk) and ring reuse against transformers' own model 1.5e-7 (llama)
# and 1.2e-7 (qwen2) at one torch thread, 9.3e-8 / 8.9e-8 at two. So the logits must be equal,
# but for the dense ring on a CPU: 2x its largest. The streamed layers' norm weights one float32
# step off read 1.9e-7 for GPTQ and fail (they passed the earlier 1e-4).
GPTQ_TOLERANCE = 0.0
RING_TOLERANCES = {"cuda": 0.0, "cpu": 3e-7}
QUIET = Reporter(bars=False)


def streamed(directory: Path, device: torch.device, plan: PlanRequest) -> tuple[list[torch.Tensor], Offload]:
    model, offload = offload_planned(directory, directory.name, torch.float32, device, plan, QUIET)
    try:
        return passes.pass_logits(CausalLM(model, offload)), offload
    finally:
        offload.close()


def logits_verdict(check: str, got: list[torch.Tensor], expected: list[torch.Tensor], offload: Offload,
                   ring: str, tolerance: float) -> Verdict:
    """PASS when the logits agree and every pass streamed every streamed layer (the ring was
    reused: it holds fewer layers than a pass)."""
    error = passes.max_difference(got, expected)
    moved_passes = offload.stats().bytes / offload.pass_bytes
    reused = offload.streamer.slots < len(offload.streamed) and moved_passes >= passes.COUNT
    return judged(check, error <= tolerance and reused,
                  f"{ring}; {passes.COUNT} passes (one tree-masked), {moved_passes:.1f} passes' bytes streamed; "
                  f"largest logit difference {error:.1e} (bound {tolerance:g})")


def check_ring_reuse(family: str, slots: int, device: torch.device, workdir: Path) -> Verdict:
    directory = small_checkpoint(family, workdir)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa")
    expected = passes.pass_logits(CausalLM(model.to(device).eval()))
    plan = PlanRequest(tier="ram", offload_dir=workdir, resident_layers=0, slots=slots)
    got, offload = streamed(directory, device, plan)
    return logits_verdict(f"ring reuse, {family} ({device.type})", got, expected, offload,
                          f"{LAYERS} layers through {slots} slots", RING_TOLERANCES[device.type])


def check_gptq_streamed(tier: str, device: torch.device, workdir: Path) -> Verdict:
    directory = gptq_checkpoint(workdir)
    resident, _ = offload_model(directory, directory.name, torch.float32, device, None, None, QUIET)  # GPTQ in memory
    expected = passes.pass_logits(CausalLM(resident))
    plan = PlanRequest(tier=tier, offload_dir=workdir, resident_layers=2, slots=2)
    got, offload = streamed(directory, device, plan)
    source = {"ram": "pinned RAM" if device.type == "cuda" else "RAM", "disk": "the disk file"}[tier]
    return logits_verdict(f"GPTQ streamed from {source} ({device.type})", got, expected, offload,
                          f"{LAYERS - 2} of {LAYERS} int4 layers through 2 slots", GPTQ_TOLERANCE)
