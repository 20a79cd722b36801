"""The CUDA mover's ordering, checked on CPU with recording stand-ins for streams and events."""

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch
from helpers.links import InstantStore

from specchat.capture_gate import CaptureGate
from specchat.offload import cuda as cuda_module
from specchat.offload.cuda import CudaMover
from specchat.offload.streamer import Streamer
from specchat.offload.transport import ThreadTransport
from specchat.transfer import TransferStats


class FakeCuda:
    """Records what the mover asks of CUDA, in order."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.compute = SimpleNamespace(name="compute", wait_event=lambda e: self.log.append(("compute waits", e.name)))
        self.copy = SimpleNamespace(name="copy")
        self.events = 0

    def Stream(self, device):
        return self.copy

    def Event(self):
        self.events += 1
        fake = self
        name = ("loaded", "free")[(self.events - 1) // self.slots] + str((self.events - 1) % self.slots)

        class Event:
            def __init__(self):
                self.name = name

            def record(self, stream):
                fake.log.append(("record", self.name, stream.name))

            def synchronize(self):
                fake.log.append(("host waits", self.name))

        return Event()

    @contextlib.contextmanager
    def stream(self, stream):
        self.log.append(("enter", stream.name))
        yield
        self.log.append(("exit", stream.name))

    def current_stream(self, device):
        return self.compute


def make_mover(monkeypatch, slots: int) -> tuple[CudaMover, FakeCuda]:
    fake = FakeCuda()
    fake.slots = slots
    monkeypatch.setattr(cuda_module.torch, "cuda", fake)
    return CudaMover([torch.zeros(16, dtype=torch.uint8) for _ in range(slots)]), fake


def test_the_loader_waits_for_compute_to_free_the_slot_then_copies_and_waits_for_the_copy(monkeypatch):
    mover, fake = make_mover(monkeypatch, slots=2)
    mover.wait_free(1)
    mover.issue(1, torch.arange(8, dtype=torch.uint8))
    mover.settle(1)
    assert fake.log == [
        ("host waits", "free1"),  # apart from the copy, so the transport keeps it out of busy time
        ("enter", "copy"), ("record", "loaded1", "copy"), ("exit", "copy"),
        ("host waits", "loaded1"),  # the staging buffer may be refilled only after the copy
    ]
    assert mover.slots[1][:8].tolist() == list(range(8))


def test_compute_waits_on_the_load_event_and_marks_the_slot_free(monkeypatch):
    mover, fake = make_mover(monkeypatch, slots=2)
    mover.wait_loaded(0)
    mover.mark_free(0)
    assert fake.log == [("compute waits", "loaded0"), ("record", "free0", "compute")]


def test_under_the_streamer_every_slot_is_freed_before_it_is_refilled(monkeypatch):
    mover, fake = make_mover(monkeypatch, slots=2)

    class InlineTransport:  # the loader thread's work, run inline so the log is ordered
        def begin(self, layer, slot, whole=False):
            mover.wait_free(slot)
            mover.issue(slot, torch.full((4,), layer, dtype=torch.uint8))
            mover.settle(slot)
            return slot

        def finish(self, slot):
            mover.wait_loaded(slot)

        def retire(self, slot):
            mover.mark_free(slot)

        def stats(self):
            return TransferStats()

    streamer = Streamer([0, 1, 2], slots=2, transport=InlineTransport())
    for layer in [0, 1, 2]:
        slot = streamer.acquire(layer)
        assert mover.slots[slot][0] == layer
        streamer.release(slot)
    # the n-th copy into a slot comes after compute recorded that slot's free event n-1 times
    copies: dict[str, int] = {}
    frees: dict[str, int] = {}
    for entry in fake.log:
        if entry[0] == "host waits" and entry[1].startswith("free"):
            copies[entry[1]] = copies.get(entry[1], 0) + 1
            assert frees.get(entry[1], 0) == copies[entry[1]] - 1
        elif entry[0] == "record" and entry[2] == "compute":
            frees[entry[1]] = frees.get(entry[1], 0) + 1
    assert max(copies.values()) >= 2  # slots were reused


def test_compute_is_woken_once_a_load_is_issued_and_its_stream_waits_for_the_copy(monkeypatch):
    """The host queues a layer's kernels while its bytes cross the link (the device waits on the
    copy's event), rather than after the loader saw the copy done: the loader is still held in
    `settle` when the compute thread has queued its wait, and the layer's bytes are counted."""
    mover, fake = make_mover(monkeypatch, slots=1)
    landing = threading.Event()

    def held_settle(slot):
        landing.wait(timeout=30)
        fake.log.append(("host waits", f"loaded{slot}"))

    monkeypatch.setattr(mover, "settle", held_settle)

    transport = ThreadTransport(InstantStore(4), [torch.full((4,), 7, dtype=torch.uint8)], mover)
    try:
        transport.finish(transport.begin(7, 0, whole=False))
        assert fake.log[-1] == ("compute waits", "loaded0") and ("host waits", "loaded0") not in fake.log
        assert transport.stats().bytes == 4
    finally:
        landing.set()
        transport.close()
    assert fake.log[-1] == ("host waits", "loaded0")  # the staging buffer is refilled only after the copy


def test_a_copy_that_fails_after_compute_was_woken_is_raised_at_the_next_wait(monkeypatch):
    mover, fake = make_mover(monkeypatch, slots=2)

    def failing_settle(slot):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(mover, "settle", failing_settle)
    transport = ThreadTransport(InstantStore(4), [torch.zeros(4, dtype=torch.uint8)] * 2, mover)
    try:
        transport.begin(0, 0, whole=False)  # its compute may be woken before its copy fails
        second = transport.begin(1, 1, whole=False)  # issued once the first load has failed
        with pytest.raises(RuntimeError, match="illegal memory access"):
            transport.finish(second)
        transport.finish(second)  # raised once: the pass that met it failed, a later one goes on
    finally:
        transport.close()


class GateReadings(list):
    """A log that notes, beside each entry, how many work blocks held the capture gate."""

    def __init__(self, gate: CaptureGate) -> None:
        super().__init__()
        self.gate = gate

    def append(self, entry: tuple) -> None:
        super().append((*entry, self.gate.working))


def test_the_loaders_cuda_calls_run_inside_the_capture_gate_and_computes_do_not(monkeypatch):
    """The loader thread's event waits and copies hold the process's capture gate, so the drafter
    never captures a step while they run (capture_gate.py: CUDA fails a capture while another
    thread synchronizes); the computing thread's calls, which never overlap its own captures, do not."""
    gate = CaptureGate()
    monkeypatch.setattr(cuda_module, "GATE", gate)
    mover, fake = make_mover(monkeypatch, slots=2)
    fake.log = GateReadings(gate)
    mover.wait_free(1)
    mover.issue(1, torch.arange(8, dtype=torch.uint8))
    mover.settle(1)
    mover.wait_loaded(1)
    mover.mark_free(1)
    assert fake.log == [("host waits", "free1", 1), ("enter", "copy", 1), ("record", "loaded1", "copy", 1),
                        ("exit", "copy", 1), ("host waits", "loaded1", 1),
                        ("compute waits", "loaded1", 0), ("record", "free1", "compute", 0)]
    assert gate.working == 0
