"""Target workers as Ray actors on an existing Ray cluster (the optional extra specchat[ray]).

Each actor loads the target itself, by the name the user gave (an alias, a hub id, or a path
that exists on the node), and runs the same TargetVerifier as a thread worker. Actors are
threaded (max_concurrency 2) so that a cancel reaches a job while it runs.
"""

import socket
from concurrent.futures import Future

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.dsi.jobs import VerifyJob
from specchat.dsi.verifier import TargetVerifier
from specchat.dsi.workers import Result
from specchat.errors import SpecchatError
from specchat.models.loading import load


def import_ray():
    try:
        import ray
    except ImportError:
        raise SpecchatError("--ray-address needs Ray: pip install 'specchat[ray]'") from None
    return ray


class RemoteVerifier:
    """Runs inside a Ray actor: the target on the actor's device and its verifier."""

    def __init__(self, target: str, dtype: torch.dtype, device: str, weights: str) -> None:
        # --weights quantized: from the target's stored 4-bit weights, packed for this actor's device
        loaded = load(target, dtype, progress=False, device=torch.device(device), weights=weights)
        loaded.model.to(device)
        self.verifier = TargetVerifier(CausalLM(loaded.model))
        self.stop_ids = stop_token_ids(loaded.model, loaded.tokenizer)
        self.max_context = loaded.model.config.max_position_embeddings

    def verify(self, job: VerifyJob) -> Result:
        return self.verifier.verify(job)

    def cancel(self, job_id: int) -> None:
        self.verifier.cancel(job_id)

    def describe(self) -> tuple[list[int], int]:
        """The target's stop ids and context length, for the driver (which loads no target)."""
        return sorted(self.stop_ids), self.max_context


class RayWorker:
    def __init__(self, name: str, actor) -> None:
        self.name = name
        self.actor = actor

    def start(self, job: VerifyJob) -> Future[Result]:
        return self.actor.verify.remote(job).future()

    def cancel(self, job_id: int) -> None:
        self.actor.cancel.remote(job_id)

    def close(self) -> None:
        import_ray().kill(self.actor)


def connect(address: str) -> None:
    """Join the cluster at `address` ('auto', HOST:PORT or ray://HOST:PORT); one clear line if
    there is none."""
    ray = import_ray()
    if address != "auto" and "://" not in address:
        check_reachable(address)
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except ConnectionError as error:
        raise SpecchatError(f"no Ray cluster at --ray-address {address}: {error}") from None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on: Ray itself retries for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SpecchatError(f"--ray-address must be auto or HOST:PORT (got '{address}')")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise SpecchatError(f"no Ray cluster at --ray-address {address}: {error}") from None


def check_capacity(devices: list[torch.device], resources: dict[str, float]) -> None:
    """Ray would wait forever for an actor the cluster cannot place: say so instead."""
    for kind, resource in (("cpu", "CPU"), ("cuda", "GPU")):
        wanted = sum(device.type == kind for device in devices)
        if wanted > resources.get(resource, 0):
            raise SpecchatError(f"--workers asks for {wanted} {resource} workers, but the Ray cluster has "
                                f"{resources.get(resource, 0):g} {resource}s")


def ray_workers(address: str, devices: list[torch.device], target: str, dtype: torch.dtype,
                weights: str) -> list[RayWorker]:
    """One actor per device, each holding one CPU or one GPU of the cluster, each loading `target`
    (from its 4-bit weights when `weights` is quantized)."""
    ray = import_ray()
    connect(address)
    check_capacity(devices, ray.cluster_resources())
    actor_class = ray.remote(max_concurrency=2)(RemoteVerifier)
    workers = []
    for i, device in enumerate(devices):
        on_gpu = device.type == "cuda"
        # Ray gives a GPU actor its own device, visible inside it as cuda (index 0).
        actor = actor_class.options(num_cpus=0 if on_gpu else 1, num_gpus=1 if on_gpu else 0).remote(
            target, dtype, device.type, weights
        )
        workers.append(RayWorker(f"ray-{device.type}#{i}", actor))
    return workers


def describe_target(worker: RayWorker) -> tuple[frozenset[int], int]:
    stop_ids, max_context = import_ray().get(worker.actor.describe.remote())
    return frozenset(stop_ids), max_context
