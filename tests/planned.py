"""A checkpoint offloaded as the memory plan places it, in two steps as the loader takes them:
`plan_checkpoint` (specchat.plan) makes the placement, `offload_model` (specchat.offload) builds it."""

from pathlib import Path

import torch

from specchat.offload.build import offload_model
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter


def offload_planned(directory: Path, name: str, dtype: torch.dtype, device: torch.device, request: PlanRequest,
                    reporter: Reporter, compact_head: bool = False, compact_layers: bool = False,
                    machine: Machine | None = None):
    """(model, Offload) of the checkpoint in `directory` placed by `request` on `machine` (this one's
    `device` when None)."""
    machine = machine or Machine(kind=device.type)
    memory = plan_checkpoint(directory, name, dtype, machine, request)
    return offload_model(directory, name, dtype, device, memory.placement, request.offload_dir, reporter,
                         compact_head, compact_layers)
