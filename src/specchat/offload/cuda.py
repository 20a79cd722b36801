"""CUDA's side of streaming: asynchronous host->device copies on a dedicated stream, the stall
timed on the compute stream, and the device's free memory.

Thin on purpose: the schedule (which layer, which slot, when) is the streamer's and the link's
accounting is the transport's, both tested on CPU; this only maps their calls onto CUDA streams
and events.
"""

import threading
from collections import deque

import torch

from specchat.capture_gate import GATE


class CudaMover:
    def __init__(self, slots: list[torch.Tensor]) -> None:
        self.slots = slots
        self.copy_stream = torch.cuda.Stream(device=slots[0].device)
        self.loaded = [torch.cuda.Event() for _ in slots]
        self.free = [torch.cuda.Event() for _ in slots]

    def wait_free(self, slot: int) -> None:
        """Runs on the loader thread: block it until the compute issued on the slot has run.
        Waiting here, outside `move`, keeps the wait out of the link's busy time; the copy that
        follows cannot overtake that compute. Never while the drafter captures a step: CUDA fails
        a capture while another thread synchronizes on an event (capture_gate.py)."""
        with GATE.work():
            self.free[slot].synchronize()

    def issue(self, slot: int, host: torch.Tensor, offset: int = 0) -> None:
        """Runs on the loader thread, once the slot is free (or held by compute, for the experts it
        fetched): the copy on the copy stream, and the event compute waits on (copies on one
        stream land in order: the last one's event covers them all). Outside a capture too: the
        pinned block's bookkeeping records and queries events."""
        with GATE.work(), torch.cuda.stream(self.copy_stream):
            self.slots[slot][offset: offset + host.numel()].copy_(host, non_blocking=True)
            self.loaded[slot].record(self.copy_stream)

    def settle(self, slot: int) -> None:
        """Block the loader thread until the copies into `slot` are done, so the host staging
        buffer may be refilled. The time it blocks is the copies' alone (a capture waits for it)."""
        with GATE.work():
            self.loaded[slot].synchronize()

    def wait_loaded(self, slot: int) -> None:
        torch.cuda.current_stream(self.slots[slot].device).wait_event(self.loaded[slot])

    def mark_free(self, slot: int) -> None:
        self.free[slot].record(torch.cuda.current_stream(self.slots[slot].device))


class CudaStallMeter:
    """The stall as the compute stream lives it. `start` records an event on the stream before
    the wait, `stop` one after it. The first completes when the compute queued before the wait
    has run; the second when that compute and the awaited copy have both finished (the host, which
    blocks in between, enqueues it once the copy is done). So their distance is
    max(0, copy done - compute ready): how long the stream stood still for the weights. The time
    the host blocked while the device still computed earlier layers is not in it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self.total = 0.0
        self.lock = threading.Lock()  # the computing thread adds waits; any thread may read stats

    def start(self) -> torch.cuda.Event:
        return self.record()

    def stop(self, mark: torch.cuda.Event) -> None:
        with self.lock:
            self.pending.append((mark, self.record()))
            self.collect()  # keeps `pending` to the waits the device has not reached yet

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self) -> float:
        """The waits the stream has got past; a wait still queued is counted by a later call, so
        a caller that synchronized the device first sees every wait."""
        with self.lock:
            self.collect()
            return self.total

    def collect(self) -> None:
        """Add the waits the stream has got past (they complete in stream order)."""
        while self.pending and self.pending[0][1].query():
            before, after = self.pending.popleft()
            self.total += before.elapsed_time(after) / 1000  # elapsed_time is in milliseconds


def free_bytes(device: torch.device) -> int:
    """Free memory on a CUDA device. torch before 2.5 rejects a device without an index in
    mem_get_info, so `cuda` is resolved to the current device's index first."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.mem_get_info(index)[0]
