"""Moving layers into ring slots from a reader thread: the transport of the layer streamer.

A single loader thread runs the loads in submission order (the streamer's cyclic order), several
consecutive layers of the disk file in one request when they are queued together; the storage
read (O_DIRECT preadv, or a tensor copy) releases the GIL, so loading overlaps compute.
What happens after the bytes are on the host is the mover's: a plain copy into a host slot on
CPU, an asynchronous copy on a dedicated stream on CUDA (offload/cuda.py).

Compute waits for a load to be issued, not done: on CUDA its stream then waits on the copy's
event, so the host goes on queueing the layer's kernels while the bytes cross the link and the
device starts them the moment they land. Blocked until the copy was done, the host queued them
only after it, and the device waited while the thread woke and launched them (the paper's pair
streamed a pass at budget 1024 at 1.39x its link time on an H200, 2026-11-30, where the same
layers resident compute well within it; how much of that this wait was, a GPU run measures).

The link is busy while it reads and copies, not while the loader waits for compute to be done
with a slot: on CUDA that wait is the device computing earlier layers (on CPU there is none, as
compute is synchronous). So busy time is the link's own, and the idle time the streamer derives
from it counts the wait for room as idle, which it is.
"""

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol

import torch

from specchat.offload.storage import LayerStore
from specchat.transfer import TransferStats

# Measured on this machine's virtio disk (docs/benchmarks.md): 256 MiB requests read faster than
# one ~94 MB layer at a time (1.56-1.90 GB/s against 1.23-1.32).
COALESCE_BYTES = 256 * 2**20


class Mover(Protocol):
    """Host bytes -> device slot, and the ordering between loads and compute."""

    def wait_free(self, slot: int) -> None:
        """Block the loader thread until compute is done with slot `slot` (before `issue`)."""

    def issue(self, slot: int, host: torch.Tensor, offset: int = 0) -> None:
        """Start copying `host` into slot `slot` from byte `offset` on (called on the loader
        thread, after `wait_free` for a ring load)."""

    def settle(self, slot: int) -> None:
        """Block the loader thread until the copies issued into `slot` are done, so that their
        host bytes (a staging buffer) may be read into again."""

    def wait_loaded(self, slot: int) -> None:
        """Make compute wait for the copies issued into `slot` (after they were issued)."""

    def mark_free(self, slot: int) -> None:
        """Compute on `slot` has been issued; a later copy must not overtake it."""


class HostMover:
    """Slots in host memory, compute on the CPU: compute is synchronous, so once a move has
    returned the slot is ready, and once compute has returned the slot is free."""

    def __init__(self, slots: list[torch.Tensor]) -> None:
        self.slots = slots

    def wait_free(self, slot: int) -> None:
        pass  # the streamer releases a slot once compute on it has returned

    def issue(self, slot: int, host: torch.Tensor, offset: int = 0) -> None:
        target = self.slots[slot][offset: offset + host.numel()]
        if host.data_ptr() != target.data_ptr():  # a disk read lands in the slot itself
            target.copy_(host)

    def settle(self, slot: int) -> None:
        pass  # the copy was done when issue returned

    def wait_loaded(self, slot: int) -> None:
        pass

    def mark_free(self, slot: int) -> None:
        pass


@dataclass
class _Job:
    layer: int
    slot: int
    issued: Future  # every copy is on its way: compute may queue its work behind them
    ranges: list[tuple[int, int]] | None = None  # byte ranges of the layer; None: all of it
    urgent: bool = False  # asked for by compute, into the slot it holds

    @property
    def nbytes(self) -> int | None:
        return None if self.ranges is None else sum(end - start for start, end in self.ranges)


class ThreadTransport:
    """Loads layers from a LayerStore into slots on one background thread.

    Loads queued back to back for layers that follow each other in the store (the disk file)
    are read in one request of up to `coalesce_bytes`: the disk keeps a deep queue instead of
    idling between two layers. The link's busy time counts the load in progress too, so two
    snapshots give exactly the busy time between them. The loader's waits for compute to free a
    slot are left out of it.
    """

    def __init__(self, store: LayerStore, staging: list[torch.Tensor], mover: Mover,
                 coalesce_bytes: int = COALESCE_BYTES, clock: Callable[[], float] = perf_counter,
                 heads: dict[int, int] | None = None) -> None:
        self.store = store
        self.heads = heads or {}  # layers streamed by expert: the bytes their ring load moves
        self.staging = staging  # per slot: where a disk read lands (the slot itself on CPU)
        self.mover = mover
        self.coalesce_bytes = coalesce_bytes
        self.clock = clock
        self.jobs: deque[_Job] = deque()
        self.wake = threading.Condition()
        self.closed = False
        self.moved_bytes = 0
        self.fetched_bytes = 0  # of moved_bytes, those compute fetched (experts)
        self.busy_s = 0.0
        self.busy_since: float | None = None
        self.requests = 0  # reads issued (a coalesced run is one)
        self.failure: BaseException | None = None  # a load's, raised in the computing thread
        self.thread = threading.Thread(target=self.run, name="specchat-loader", daemon=True)
        self.thread.start()

    def begin(self, layer: int, slot: int, whole: bool) -> _Job:
        ranges = [(0, self.heads[layer])] if layer in self.heads and not whole else None
        return self.queue(_Job(layer, slot, Future(), ranges))

    def fetch(self, layer: int, slot: int, ranges: list[tuple[int, int]]) -> _Job:
        """Load byte ranges of `layer` into `slot`, which compute holds, before any queued load."""
        return self.queue(_Job(layer, slot, Future(), ranges, urgent=True))

    def queue(self, job: _Job) -> _Job:
        with self.wake:
            if job.urgent:
                self.jobs.appendleft(job)
            else:
                self.jobs.append(job)
            self.wake.notify()
        return job

    def run(self) -> None:
        while True:
            with self.wake:
                while not self.jobs and not self.closed:
                    self.wake.wait()
                if self.closed:
                    for job in self.jobs:  # nobody waits for them any more
                        job.issued.cancel()
                    return
                batch = self.take_run()
                self.busy_since = self.clock()
            self.load(batch)

    def take_run(self) -> list[_Job]:
        """The first queued load and those right behind it that follow it in the store."""
        batch = [self.jobs.popleft()]
        if batch[0].ranges is not None:
            return batch
        size = self.store.nbytes(batch[0].layer)
        while self.jobs and self.jobs[0].ranges is None and self.store.follows(batch[-1].layer, self.jobs[0].layer):
            size += self.store.nbytes(self.jobs[0].layer)
            if size > self.coalesce_bytes:
                break
            batch.append(self.jobs.popleft())
        return batch

    def load(self, batch: list[_Job]) -> None:
        """Run the batch's loads (each job's bytes counted as it is issued: `issued`)."""
        error = None
        try:
            if batch[0].ranges is None:
                self.load_layers(batch)
            else:
                self.load_ranges(batch[0])
        except BaseException as failure:  # handed to the computing thread, which re-raises it
            error = failure
        with self.wake:
            self.busy_s += self.clock() - self.busy_since
            self.busy_since = None
            self.requests += 1
        if error is None:
            return
        waiting = [job for job in batch if not job.issued.done()]
        for job in waiting:
            job.issued.set_exception(error)
        if not waiting:  # it failed after every copy was issued (waiting for one to land): the next wait raises it
            self.failure = error

    def load_layers(self, batch: list[_Job]) -> None:
        hosts = self.store.read_run([job.layer for job in batch], [self.staging[job.slot] for job in batch])
        for job, host in zip(batch, hosts):
            self.wait_free(job.slot)
            self.mover.issue(job.slot, host)
            self.issued(job)
            self.mover.settle(job.slot)

    def load_ranges(self, job: _Job) -> None:
        hosts = self.store.read_ranges(job.layer, job.ranges, self.staging[job.slot])
        if not job.urgent:
            self.wait_free(job.slot)
        for host, (start, _) in zip(hosts, job.ranges):  # each range at its own place in the staging buffer
            self.mover.issue(job.slot, host, start)
        self.issued(job)
        self.mover.settle(job.slot)

    def issued(self, job: _Job) -> None:
        """The job's copies are on their way: the counters take its bytes, then the waiting compute
        is woken, so that it reads statistics that include what it waited for."""
        nbytes = self.job_bytes(job)
        with self.wake:
            self.moved_bytes += nbytes
            self.fetched_bytes += nbytes if job.urgent else 0
        job.issued.set_result(None)

    def job_bytes(self, job: _Job) -> int:
        return self.store.nbytes(job.layer) if job.ranges is None else job.nbytes

    def wait_free(self, slot: int) -> None:
        """The mover's wait for room, with the link's busy clock stopped meanwhile."""
        with self.wake:
            self.busy_s += self.clock() - self.busy_since
            self.busy_since = None
        try:
            self.mover.wait_free(slot)
        finally:
            with self.wake:
                self.busy_since = self.clock()

    def finish(self, ticket: _Job) -> None:
        """Compute waits for the ticket's copies: the host until they are issued (re-raising a
        failed read in the computing thread), the device until they land."""
        ticket.issued.result()
        if self.failure is not None:  # raised once: the pass that meets it fails, the next one resyncs the ring
            failure, self.failure = self.failure, None
            raise failure
        self.mover.wait_loaded(ticket.slot)

    def retire(self, slot: int) -> None:
        self.mover.mark_free(slot)

    def stats(self) -> TransferStats:
        with self.wake:
            busy = self.busy_s + (self.clock() - self.busy_since if self.busy_since is not None else 0.0)
            return TransferStats(self.moved_bytes, busy, fetched_bytes=self.fetched_bytes)

    def close(self) -> None:
        """Finish the read in progress, drop the queued ones, stop the thread (idempotent)."""
        with self.wake:
            self.closed = True
            self.wake.notify()
        self.thread.join()
