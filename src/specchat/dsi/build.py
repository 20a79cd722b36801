"""DSI's target workers as Ray actors that each load the target (thread workers over a target
loaded here are built by `specchat.runtime`)."""

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from specchat.dsi.remote import describe_target, ray_workers
from specchat.dsi.workers import WorkerPool, parse_devices
from specchat.models.loading import load_tokenizer
from specchat.progress import Reporter


@dataclass
class TargetWorkers:
    pool: WorkerPool
    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    max_context: int


def default_workers(device: torch.device) -> str:
    """Two workers on the device the rest runs on: the least that lets verifications overlap."""
    return f"{device.type},{device.type}"


def build_ray_workers(target: str, dtype: torch.dtype, workers: str, ray_address: str, reporter: Reporter,
                      weights: str) -> TargetWorkers:
    """Ray actors that each load `target` (from its 4-bit weights when `weights` is quantized)."""
    devices = parse_devices(workers)
    reporter.step(f"starting {len(devices)} Ray workers, each loading {target}")
    remote = ray_workers(ray_address, devices, target, dtype, weights)
    tokenizer = load_tokenizer(target, reporter.bars, reporter.report)
    stop_ids, max_context = describe_target(remote[0])
    return TargetWorkers(WorkerPool(remote), tokenizer, stop_ids, max_context)
