"""A checkpoint offloaded as the memory plan places it, in two steps as the loader takes them:
`plan_checkpoint` (specchat.plan) makes the placement, `offload_model` (specchat.offload) builds it."""

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.offload.build import Offload, offload_model
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


@contextmanager
def streamed_from(directory: Path, name: str, tier: str,
                  offload_dir: Path) -> Iterator[tuple[PreTrainedModel, Offload]]:
    """(model, Offload) of the checkpoint in `directory` in float32 on the CPU with every layer
    streamed from `tier` through a 2-slot ring, closed on leaving."""
    request = PlanRequest(tier=tier, offload_dir=offload_dir, resident_layers=0, slots=2)
    model, offload = offload_planned(directory, name, torch.float32, torch.device("cpu"), request,
                                     Reporter(bars=False))
    try:
        yield model, offload
    finally:
        offload.close()


@contextmanager
def streamed(directory: Path, tier: str, offload_dir: Path, slots: int, by_expert: bool = True,
             expert_cache: int = 0, whole_loads: bool = False) -> Iterator[tuple[CausalLM, Offload]]:
    """The checkpoint in float32 on the CPU with every layer streamed from `tier` through a ring of
    `slots` (1: every call of a 2-layer model's layer finds its slot last held by the other layer),
    in the form the plan chose (a GGUF's Q6_K linears and Q4_K scales as stored, where they stream
    fewer bytes); `by_expert`: a MoE layer's experts fetched as its router picks them, none of them
    waiting on the device but in `expert_cache` bytes (the plan's room left aside), and every call
    fetching however widely it routed (`whole_loads`: the ring loads whole layers after a call
    that routed to nearly all its experts, as by default)."""
    request = PlanRequest(tier=tier, offload_dir=offload_dir, resident_layers=0, slots=2)
    memory = plan_checkpoint(directory, "tiny-moe", torch.float32, Machine(kind="cpu"), request)
    model, offload = offload_model(directory, "tiny-moe", torch.float32, torch.device("cpu"),
                                   dataclasses.replace(memory.placement, slots=slots, expert_cache=expert_cache),
                                   offload_dir, Reporter(bars=False),
                                   compact_layers=memory.compact_layers, by_expert=by_expert, whole_loads=whole_loads)
    try:
        yield CausalLM(model, offload), offload
    finally:
        offload.close()
