"""Target workers on local devices, one thread each, and the pool that feeds them jobs."""

import copy
from itertools import count
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from specchat.cuda_device import cuda_usable, unused_gpu
from specchat.decoding.forward import CausalLM
from specchat.dsi.jobs import Preempted, VerifyJob
from specchat.dsi.verifier import TargetVerifier
from specchat.errors import SpecchatError

Result = tuple[list[int], float]  # the target's tokens, and the worker's seconds


class Worker(Protocol):
    name: str

    def start(self, job: VerifyJob) -> Future[Result]: ...

    def cancel(self, job_id: int) -> None: ...

    def close(self) -> None: ...


def parse_devices(spec: str) -> list[torch.device]:
    """'cpu,cpu' or 'cuda:0,cuda:1' -> devices; one clear error for anything else."""
    names = [name.strip() for name in spec.split(",")]
    if not names or any(not name for name in names):
        raise SpecchatError(f"--workers must be a comma list of devices such as cpu,cpu (got '{spec}')")
    devices = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise SpecchatError(f"--workers: '{name}' is not a device (use cpu, cuda or cuda:N)") from None
        if device.type not in ("cpu", "cuda"):
            raise SpecchatError(f"--workers: '{name}' is not a cpu or cuda device")
        if device.type == "cuda" and not device_exists(device):
            raise SpecchatError(f"--workers: {name} is not available on this machine"
                                + (f" ({unused})" if (unused := unused_gpu()) else ""))
        devices.append(device)
    return devices


def device_exists(device: torch.device) -> bool:
    if not cuda_usable():
        return False
    return device.index is None or device.index < torch.cuda.device_count()


def same_device(a: torch.device, b: torch.device) -> bool:
    """cuda and cuda:0 name one device (the current one is taken as 0)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def instance_on(model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """A separate instance of `model` on `device`: its own modules (and so its own hooks). On
    the model's device it shares the weight tensors, so N workers cost one copy of the weights."""
    if same_device(device, model.device):
        shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        return copy.deepcopy(model, memo=shared)
    return copy.deepcopy(model).to(device)


class ThreadWorker:
    """A target instance and its KV cache, verifying jobs on a thread of its own."""

    def __init__(self, name: str, target: CausalLM) -> None:
        self.name = name
        self.verifier = TargetVerifier(target)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dsi-{name}")

    def start(self, job: VerifyJob) -> Future[Result]:
        return self.executor.submit(self.verifier.verify, job)

    def cancel(self, job_id: int) -> None:
        self.verifier.cancel(job_id)

    def close(self) -> None:
        self.executor.shutdown(wait=True)


def thread_workers(target: CausalLM, devices: list[torch.device]) -> list[ThreadWorker]:
    return [
        ThreadWorker(f"{device}#{i}", CausalLM(instance_on(target.model, device)))
        for i, device in enumerate(devices)
    ]


@dataclass
class Running:
    job: VerifyJob
    worker: Worker
    future: Future[Result]
    cancelled: bool = False


def is_dropped(running: Running) -> bool:
    """A cancelled job that finished anyway or stopped with Preempted: nothing to report."""
    error = running.future.exception()
    return running.cancelled and (error is None or isinstance(error, Preempted))


class WorkerPool:
    """Jobs wait first-in first-out for an idle worker; cancelled jobs leave the queue at once,
    and a cancelled running job frees its worker when it stops."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.idle: deque[Worker] = deque(workers)
        self.queue: deque[VerifyJob] = deque()
        self.running: list[Running] = []
        self.job_ids = count()  # unique over the pool's life, whichever engine sends the jobs

    def next_job_id(self) -> int:
        return next(self.job_ids)

    def submit(self, job: VerifyJob) -> None:
        self.queue.append(job)
        self.dispatch()

    def dispatch(self) -> None:
        while self.idle and self.queue:
            job, worker = self.queue.popleft(), self.idle.popleft()
            self.running.append(Running(job, worker, worker.start(job)))

    def live_jobs(self) -> list[VerifyJob]:
        """Jobs queued or running and not cancelled, oldest first."""
        return [r.job for r in self.running if not r.cancelled] + list(self.queue)

    def cancel(self, job_ids: set[int]) -> int:
        """Cancel these jobs wherever they are; returns how many were still live."""
        cancelled = 0
        for job in [job for job in self.queue if job.id in job_ids]:
            self.queue.remove(job)
            cancelled += 1
        for running in self.running:
            if running.job.id in job_ids and not running.cancelled:
                running.cancelled = True
                running.worker.cancel(running.job.id)
                cancelled += 1
        return cancelled

    def collect(self, block: bool) -> list[tuple[VerifyJob, Result]]:
        """Results of the live jobs that finished (waiting for at least one finished job if
        `block`), in the order they were sent. Every finished job's worker is freed and queued
        jobs dispatched before a failed job's error is raised."""
        if block and self.running:
            wait([r.future for r in self.running], return_when=FIRST_COMPLETED)
        done, still = [], []
        for running in self.running:  # one done() per job: a job finishing meanwhile waits for the next call
            (done if running.future.done() else still).append(running)
        self.running = still
        self.idle.extend(running.worker for running in done)
        self.dispatch()
        return [(running.job, running.future.result()) for running in done if not is_dropped(running)]

    def close(self) -> None:
        self.cancel({job.id for job in self.live_jobs()})
        for worker in self.workers:
            worker.close()
