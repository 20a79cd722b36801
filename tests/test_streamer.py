"""The streamer's schedule: ring order, prefetch across passes, slot reuse, resync, overlap."""

import threading
import time

import pytest
import torch

from specchat.offload.streamer import Streamer
from specchat.transfer import TransferStats
from specchat.offload.transport import HostMover, ThreadTransport


class RecordingTransport:
    """Completes loads at once and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def begin(self, layer, slot):
        self.calls.append(("begin", layer, slot))
        return (layer, slot)

    def finish(self, ticket):
        self.calls.append(("finish", *ticket))

    def retire(self, slot):
        self.calls.append(("retire", slot))

    def stats(self):
        return TransferStats()


def run_pass(streamer: Streamer, layers: list[int], seen: list[tuple[int, int]]) -> None:
    for layer in layers:
        slot = streamer.acquire(layer)
        seen.append((layer, slot))
        streamer.release(slot)


def test_ring_prefetches_the_first_slots_at_construction():
    transport = RecordingTransport()
    Streamer([0, 1, 2, 3, 4], slots=3, transport=transport)
    assert transport.calls == [("begin", 0, 0), ("begin", 1, 1), ("begin", 2, 2)]


def test_slots_are_reused_in_ring_order_and_the_next_pass_is_prefetched():
    transport = RecordingTransport()
    streamer = Streamer([0, 1, 2, 3, 4], slots=3, transport=transport)
    seen: list[tuple[int, int]] = []
    run_pass(streamer, [0, 1, 2, 3, 4], seen)
    assert seen == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1)]
    begins = [c[1:] for c in transport.calls if c[0] == "begin"]
    # after layer 4 is released, the loads in flight are the first layers of the next pass
    assert begins[-3:] == [(0, 2), (1, 0), (2, 1)]
    run_pass(streamer, [0, 1, 2, 3, 4], seen)
    assert [layer for layer, _ in seen[5:]] == [0, 1, 2, 3, 4]


def test_a_slot_is_reloaded_only_after_compute_released_it():
    transport = RecordingTransport()
    streamer = Streamer([0, 1, 2, 3], slots=2, transport=transport)
    run_pass(streamer, [0, 1, 2, 3], [])
    busy: set[int] = set()
    loading: set[int] = {0, 1}
    for call in transport.calls:
        if call[0] == "begin" and call[1:] not in [(0, 0), (1, 1)]:
            assert call[2] not in busy and call[2] not in loading
            loading.add(call[2])
        elif call[0] == "finish":
            loading.discard(call[2])
            busy.add(call[2])
        elif call[0] == "retire":
            busy.discard(call[1])


def test_an_abandoned_pass_resyncs_on_the_next_call():
    transport = RecordingTransport()
    streamer = Streamer([0, 1, 2, 3, 4], slots=2, transport=transport)
    seen: list[tuple[int, int]] = []
    run_pass(streamer, [0, 1], seen)  # the pass stops after layer 1 (an exception, say)
    run_pass(streamer, [0, 1, 2, 3, 4], seen)
    assert [layer for layer, _ in seen] == [0, 1, 0, 1, 2, 3, 4]
    with pytest.raises(KeyError):
        streamer.acquire(9)


def test_one_layer_one_slot_still_cycles():
    streamer = Streamer([0], slots=4, transport=RecordingTransport())
    seen: list[tuple[int, int]] = []
    for _ in range(3):
        run_pass(streamer, [0], seen)
    assert seen == [(0, 0)] * 3


class VirtualLink:
    """A link that copies one layer at a time in `copy_s` of virtual time; compute advances the
    same clock. Deterministic: the schedule alone decides the total."""

    def __init__(self, copy_s: float) -> None:
        self.copy_s = copy_s
        self.now = 0.0
        self.link_free = 0.0

    def begin(self, layer, slot):
        start = max(self.now, self.link_free)
        self.link_free = start + self.copy_s
        return self.link_free

    def finish(self, ticket):
        self.now = max(self.now, ticket)

    def retire(self, slot):
        pass

    def stats(self):
        return TransferStats()


@pytest.mark.parametrize("copy_s, compute_s", [(1.0, 1.0), (2.0, 0.5), (0.5, 2.0)])
def test_copy_and_compute_overlap_in_virtual_time(copy_s, compute_s):
    layers, passes = 10, 3
    link = VirtualLink(copy_s)
    streamer = Streamer(list(range(layers)), slots=3, transport=link, clock=lambda: link.now)
    for _ in range(passes):
        for layer in range(layers):
            slot = streamer.acquire(layer)
            link.now += compute_s
            streamer.release(slot)
    work = passes * layers
    assert link.now == pytest.approx(max(copy_s, compute_s) * work + min(copy_s, compute_s), rel=1e-9)
    assert streamer.stats().stall_s == pytest.approx(link.now - compute_s * work)


class SleepyStore:
    """A storage whose reads take `read_s` (sleeping releases the GIL, like a real read)."""

    def __init__(self, read_s: float, nbytes: int) -> None:
        self.read_s = read_s
        self.size = nbytes
        self.threads: set[str] = set()

    def read_run(self, layers, stagings):
        self.threads.add(threading.current_thread().name)
        time.sleep(self.read_s * len(layers))
        return stagings

    def follows(self, previous, layer):
        return False

    def nbytes(self, layer):
        return self.size


def test_thread_transport_overlaps_a_slow_copy_with_compute():
    read_s = compute_s = 0.03
    layers = 12
    slots = [torch.zeros(64, dtype=torch.uint8) for _ in range(3)]
    store = SleepyStore(read_s, 64)
    transport = ThreadTransport(store, slots, HostMover(slots))
    streamer = Streamer(list(range(layers)), slots=3, transport=transport)
    time.sleep(3 * read_s)  # let the first loads land, as drafting does before a pass
    start = time.perf_counter()
    for layer in range(layers):
        slot = streamer.acquire(layer)
        time.sleep(compute_s)
        streamer.release(slot)
    wall = time.perf_counter() - start
    streamer.drain()
    transport.close()
    serial = layers * (read_s + compute_s)
    assert wall < 0.75 * serial, f"no overlap: {wall:.3f}s vs {serial:.3f}s serial"
    assert store.threads and all(name.startswith("specchat-loader") for name in store.threads)
    moved = transport.stats()
    assert moved.bytes == 64 * (layers + 3)  # every layer, plus the next pass's first three
    assert moved.transfer_s >= (layers + 3) * read_s * 0.9


def test_a_failed_read_surfaces_in_the_computing_thread():
    class BrokenStore(SleepyStore):
        def read_run(self, layers, stagings):
            raise OSError("disk gone")

    slots = [torch.zeros(8, dtype=torch.uint8)]
    transport = ThreadTransport(BrokenStore(0, 8), slots, HostMover(slots))
    streamer = Streamer([0, 1], slots=1, transport=transport)
    with pytest.raises(OSError, match="disk gone"):
        streamer.acquire(0)
    transport.close()
