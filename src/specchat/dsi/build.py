"""Building DSI's target workers from user-facing options: threads over one loaded target, or
Ray actors that load their own."""

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.dsi.remote import describe_target, ray_workers
from specchat.dsi.workers import WorkerPool, parse_devices, thread_workers
from specchat.models.loading import load, load_tokenizer
from specchat.progress import Reporter


@dataclass
class TargetWorkers:
    pool: WorkerPool
    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    context_tokens: int


def default_workers(device: torch.device) -> str:
    """Two workers on the device the rest runs on: the least that lets verifications overlap."""
    return f"{device.type},{device.type}"


def build_workers(target: str, dtype: torch.dtype, workers: str, ray_address: str | None,
                  reporter: Reporter) -> TargetWorkers:
    devices = parse_devices(workers)
    if ray_address is not None:
        reporter.step(f"starting {len(devices)} Ray workers, each loading {target}")
        remote = ray_workers(ray_address, devices, target, dtype)
        tokenizer = load_tokenizer(target, reporter.bars, reporter.report)
        stop_ids, context_tokens = describe_target(remote[0])
        return TargetWorkers(WorkerPool(remote), tokenizer, stop_ids, context_tokens)
    loaded = load(target, dtype, reporter.bars, reporter.report)
    reporter.step(f"starting {len(devices)} target workers on {workers}")
    pool = WorkerPool(thread_workers(CausalLM(loaded.model), devices))
    return TargetWorkers(pool, loaded.tokenizer, stop_token_ids(loaded.model, loaded.tokenizer),
                         loaded.model.config.max_position_embeddings)
