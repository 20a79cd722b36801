"""Moving layers into ring slots from a reader thread: the transport of the layer streamer.

A single loader thread runs the loads in submission order (the streamer's cyclic order); the
storage read (O_DIRECT preadv, or a tensor copy) releases the GIL, so loading overlaps compute.
What happens after the bytes are on the host is the mover's: a plain copy into a host slot on
CPU, an asynchronous copy on a dedicated stream on CUDA (offload/cuda.py).
"""

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from time import perf_counter
from typing import Protocol

import torch

from specchat.offload.storage import LayerStore
from specchat.transfer import TransferStats


class Mover(Protocol):
    """Host bytes -> device slot, and the ordering between loads and compute."""

    def move(self, slot: int, host: torch.Tensor) -> None:
        """Copy `host` into slot `slot` (called on the loader thread, after the slot is free)."""

    def wait_loaded(self, slot: int) -> None:
        """Make compute wait for the last move into `slot`."""

    def mark_free(self, slot: int) -> None:
        """Compute on `slot` has been issued; a later move must not overtake it."""


class HostMover:
    """Slots in host memory, compute on the CPU: compute is synchronous, so once a move has
    returned the slot is ready, and once compute has returned the slot is free."""

    def __init__(self, slots: list[torch.Tensor]) -> None:
        self.slots = slots

    def move(self, slot: int, host: torch.Tensor) -> None:
        target = self.slots[slot]
        if host.data_ptr() != target.data_ptr():  # a disk read lands in the slot itself
            target[: host.numel()].copy_(host)

    def wait_loaded(self, slot: int) -> None:
        pass

    def mark_free(self, slot: int) -> None:
        pass


class ThreadTransport:
    """Loads layers from a LayerStore into slots on one background thread."""

    def __init__(self, store: LayerStore, staging: list[torch.Tensor], mover: Mover) -> None:
        self.store = store
        self.staging = staging  # per slot: where a disk read lands (the slot itself on CPU)
        self.mover = mover
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specchat-loader")
        self.lock = threading.Lock()
        self.moved = TransferStats()

    def begin(self, layer: int, slot: int) -> tuple[Future, int]:
        return self.pool.submit(self.load, layer, slot), slot

    def load(self, layer: int, slot: int) -> None:
        start = perf_counter()
        host = self.store.read(layer, self.staging[slot])
        self.mover.move(slot, host)
        elapsed = perf_counter() - start
        with self.lock:
            self.moved = TransferStats(self.moved.bytes + self.store.nbytes(layer), self.moved.transfer_s + elapsed)

    def finish(self, ticket: tuple[Future, int]) -> None:
        future, slot = ticket
        future.result()  # re-raises a failed read in the computing thread
        self.mover.wait_loaded(slot)

    def retire(self, slot: int) -> None:
        self.mover.mark_free(slot)

    def stats(self) -> TransferStats:
        with self.lock:
            return self.moved

    def close(self) -> None:
        self.pool.shutdown(wait=True)
