"""Pinned host->device bandwidth: what the streamer moved while the link was busy (bytes over its
busy time, which leaves out the loader's waits for compute) against `specchat doctor`'s probe of
pinned copies. The wide model's 134 MB layers make per-layer overheads small."""

from pathlib import Path

import torch
from gpu_checks.tiny_models import wide_checkpoint
from gpu_checks.verdict import Verdict, judged, skipped
from helpers.planned import offload_planned

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.plan.request import PlanRequest
from specchat.offload.probe import measure_h2d_gbps
from specchat.progress import Reporter

BOUNDS = (0.5, 1.5)  # streamer / probe; below: time lost per layer, above: busy time undercounted
PASSES = 3
CHECK = "pinned host->device bandwidth"


def check_bandwidth(device: torch.device, workdir: Path) -> Verdict:
    probed = measure_h2d_gbps()
    if probed is None:
        return skipped(CHECK, "no CUDA device: doctor's probe times pinned host->device copies")
    directory = wide_checkpoint(workdir)
    plan = PlanRequest(tier="ram", offload_dir=workdir, resident_layers=0, slots=2)
    model, offload = offload_planned(directory, directory.name, torch.bfloat16, device, plan, Reporter(bars=False))
    try:
        lm = CausalLM(model, offload)
        for step in range(PASSES):
            lm.hidden(torch.tensor([step]), torch.tensor([0]), new_cache())
        moved = offload.stats()
    finally:
        offload.close()
    ratio = moved.gbps / probed
    return judged(CHECK, BOUNDS[0] <= ratio <= BOUNDS[1],
                  f"streamer {moved.gbps:.2f} GB/s over {moved.bytes / 1e9:.2f} GB, doctor's probe {probed:.2f} GB/s: "
                  f"{ratio:.2f} of it (bounds {BOUNDS[0]:g}..{BOUNDS[1]:g})")
