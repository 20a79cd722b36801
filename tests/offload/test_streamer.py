"""The streamer's schedule: ring order, prefetch across passes, slot reuse, resync, overlap."""

import threading
from collections.abc import Sequence

import pytest
import torch
from helpers.links import InstantStore, VirtualLink

from specchat.offload.placement import Placement
from specchat.offload.streamer import Streamer
from specchat.offload.transport import HostMover, ThreadTransport
from specchat.transfer import TransferStats


class RecordingTransport:
    """Completes loads at once and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def begin(self, layer, slot, whole=False):
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
    loading: set[int] = {0, 1}  # the two loads made at construction
    reloads = 0
    for call in transport.calls[2:]:
        if call[0] == "begin":
            assert call[2] not in busy and call[2] not in loading, f"slot {call[2]} reused too early: {call}"
            loading.add(call[2])
            reloads += 1
        elif call[0] == "finish":
            loading.discard(call[2])
            busy.add(call[2])
        elif call[0] == "retire":
            busy.discard(call[1])
    # every release reloaded its slot (layers 2 and 3, then the next pass's 0 and 1), each checked above
    assert reloads == 4 and [c[0] for c in transport.calls[2:]].count("retire") == 4


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
    work, elapsed = passes * layers, link.now - link.START
    assert elapsed == pytest.approx(max(copy_s, compute_s) * work + min(copy_s, compute_s), rel=1e-9)
    assert streamer.stats().stall_s == pytest.approx(elapsed - compute_s * work)


def pass_s(layers: int, streamed: Sequence[int], slots: int, copy_s: float, compute_s: float, draft_s: float,
           passes: int = 3) -> float:
    """Virtual seconds of the last of `passes` passes over `layers` layers, every layer computing
    in `compute_s`, each of `streamed` loaded in `copy_s` through a ring of `slots`, `draft_s`
    between passes (the draft's tree, while the ring fills with the next pass's first layers)."""
    link = VirtualLink(copy_s)
    streamer = Streamer(streamed, slots, transport=link, clock=lambda: link.now)
    for _ in range(passes):
        link.now += draft_s
        start = link.now
        for layer in range(layers):
            slot = streamer.acquire(layer) if layer in streamed else None
            link.now += compute_s
            if slot is not None:
                streamer.release(slot)
    return link.now - start


def test_resident_layers_spread_among_the_streamed_compute_while_the_link_loads():
    """The traced H200 pass (docs/benchmarks.md): 80 layers, 15 resident, a ring of 2 slots, a
    layer's load 8.3 ms and its compute 5.2 ms, 0.3 s of drafting. Resident layers first, the
    link waits through their compute (its slots hold the next layers); spread as placed, a pass is
    bound by the link from the first layer's release to the last load: the first layer's compute,
    the 63 loads left, the last streamed layer's compute and the resident layer's after it."""
    copy_s, compute_s, draft_s = 0.0083, 0.0052, 0.3
    spread = Placement((1,) * 80, resident=15, ram=65, disk=0, slots=2, slot_bytes=1, needed=0).streamed
    residents_first = pass_s(80, list(range(15, 80)), 2, copy_s, compute_s, draft_s)
    spread_s = pass_s(80, spread, 2, copy_s, compute_s, draft_s)
    assert residents_first == pytest.approx(15 * compute_s + compute_s + 63 * copy_s + compute_s)
    assert spread_s == pytest.approx(compute_s + 63 * copy_s + 2 * compute_s)
    # ring slots in their place, filled during the draft (17 x 8.3 ms within its 0.3 s): the same 63 loads
    slots_s = pass_s(80, list(range(80)), 17, copy_s, compute_s, draft_s)
    assert slots_s == pytest.approx(compute_s + 63 * copy_s + compute_s)
    print(f"a pass: residents first {residents_first * 1e3:.1f} ms, spread {spread_s * 1e3:.1f} ms, "
          f"17 slots and none resident {slots_s * 1e3:.1f} ms")


HANG_S = 30  # bound on a wait that only guards against a hang


class MeetingStore(InstantStore):
    """Each read of the layer after `layer` waits, inside the read, for the compute of `layer`
    to begin, and that compute waits for the read to begin (a barrier per layer): both are in
    progress at once, or the barrier breaks. Every read advances `clock` by `read_s`, the only
    thing that moves it."""

    def __init__(self, nbytes: int, layers: int, read_s: float) -> None:
        super().__init__(nbytes)
        self.meetings = [threading.Barrier(2, timeout=HANG_S) for _ in range(layers)]
        self.read_s = read_s
        self.now = 0.0
        self.log: list[tuple[str, int]] = []  # ("read", n) as the n-th read begins, ("computed", layer)
        self.reads = 0
        self.threads: set[str] = set()

    def clock(self) -> float:
        return self.now

    def read_run(self, layers, stagings):
        self.threads.add(threading.current_thread().name)
        for _ in layers:
            number, self.reads = self.reads, self.reads + 1
            self.log.append(("read", number))
            if 0 < number <= len(self.meetings):  # read n is of the layer after layer n - 1
                self.meetings[number - 1].wait()
            self.now += self.read_s
        return stagings

    def compute(self, layer: int) -> None:
        self.meetings[layer].wait()
        self.log.append(("computed", layer))


def test_thread_transport_reads_the_next_layer_while_a_layer_computes():
    layers, read_s = 12, 0.5
    slots = [torch.zeros(64, dtype=torch.uint8) for _ in range(3)]
    store = MeetingStore(64, layers, read_s)
    transport = ThreadTransport(store, slots, HostMover(slots), clock=store.clock)
    streamer = Streamer(list(range(layers)), slots=3, transport=transport)
    for layer in range(layers):
        slot = streamer.acquire(layer)
        store.compute(layer)  # returns once the loader is inside the read of layer + 1
        streamer.release(slot)
    streamer.drain()
    transport.close()
    # The n-th read loads layer n (the ring's order): the next layer's load began before this
    # layer's compute ended, layer after layer.
    assert all(store.log.index(("read", layer + 1)) < store.log.index(("computed", layer)) for layer in range(layers))
    assert store.threads == {"specchat-loader"}
    moved = transport.stats()
    assert moved.bytes == 64 * (layers + 3)  # every layer, plus the next pass's first three
    assert moved.transfer_s == (layers + 3) * read_s  # busy exactly while reading, on the store's clock


def test_a_failed_read_surfaces_in_the_computing_thread():
    class BrokenStore(InstantStore):
        def read_run(self, layers, stagings):
            raise OSError("disk gone")

    slots = [torch.zeros(8, dtype=torch.uint8)]
    transport = ThreadTransport(BrokenStore(8), slots, HostMover(slots))
    streamer = Streamer([0, 1], slots=1, transport=transport)
    with pytest.raises(OSError, match="disk gone"):
        streamer.acquire(0)
    transport.close()


class MeteredLink(VirtualLink):
    """The virtual link, also reporting its busy time up to the current virtual moment."""

    def __init__(self, copy_s: float) -> None:
        super().__init__(copy_s)
        self.loads: list[tuple[float, float]] = []

    def begin(self, layer, slot, whole=False):
        done = super().begin(layer, slot, whole)
        self.loads.append((done - self.copy_s, done))
        return done

    def stats(self):
        busy = sum(max(0.0, min(end, self.now) - start) for start, end in self.loads)
        return TransferStats(transfer_s=busy)


def decode(streamer: Streamer, link: MeteredLink, layers: int, iterations: int, draft_s: float,
           compute_s: float, starts: list[float] | None = None) -> list[tuple[float, float]]:
    """Iterations of drafting then one target pass; per pass: (its stall, the link's idle
    share of the iteration); each pass's stall at its first layer appended to `starts`."""
    passes = []
    for _ in range(iterations):
        before, start = streamer.stats(), link.now
        link.now += draft_s  # the draft tree grows; the link keeps loading
        for layer in range(layers):
            slot = streamer.acquire(layer)
            link.now += compute_s
            streamer.release(slot)
        moved = streamer.stats() - before
        passes.append((moved.stall_s, moved.idle_s / (link.now - start)))
        if starts is not None:
            starts.append(moved.start_stall_s)
    return passes


def test_with_a_whole_pass_staged_a_pass_after_drafting_never_waits_on_the_link():
    layers, copy_s = 10, 1.0
    link = MeteredLink(copy_s)
    streamer = Streamer(list(range(layers)), slots=layers, transport=link, clock=lambda: link.now)
    passes = decode(streamer, link, layers, iterations=4, draft_s=layers * copy_s, compute_s=0.1)
    assert [stall for stall, _ in passes] == [0.0] * 4
    assert [idle for _, idle in passes] == [0.0] * 4  # once the pass is staged, nothing is left to move


def test_a_small_ring_stalls_the_pass_and_idles_the_link_while_drafting():
    layers, copy_s, slots = 10, 1.0, 4
    link = MeteredLink(copy_s)
    streamer = Streamer(list(range(layers)), slots=slots, transport=link, clock=lambda: link.now)
    assert streamer.stats().idle_s == 0.0  # no time has passed since it started (the clock reads START, not 0)
    passes = decode(streamer, link, layers, iterations=3, draft_s=layers * copy_s, compute_s=0.1)
    for stall, idle in passes[1:]:
        # only 4 layers arrive while drafting; the pass waits for most of the other 6
        assert stall > (layers - slots - 1) * copy_s
        # drafting 10 s with room for 4 layers: the link rests ~6 s of an iteration of ~16 s
        assert 0.3 < idle < 0.45


def test_the_stall_at_a_pass_start_is_what_drafting_left_the_link_to_load():
    """The wait for a pass's first streamed layer is metered apart: none where drafting lasted
    long enough to load it (a small ring still stalls later in the pass), the whole copy where
    nothing drafted and the link was still busy with the previous pass's loads."""
    layers, copy_s, slots = 10, 1.0, 4
    for draft_s, waits_at_start in ((layers * copy_s, False), (0.0, True)):
        link = MeteredLink(copy_s)
        streamer = Streamer(list(range(layers)), slots=slots, transport=link, clock=lambda: link.now)
        starts: list[float] = []
        passes = decode(streamer, link, layers, iterations=3, draft_s=draft_s, compute_s=0.1, starts=starts)
        for (stall, _), start in zip(passes[1:], starts[1:], strict=True):
            assert stall > (layers - slots - 1) * copy_s and 0.0 <= start <= stall
            assert (start > 0.5 * copy_s) == waits_at_start


def test_staging_helps_only_as_far_as_drafting_lasts():
    layers, copy_s = 10, 1.0
    link = MeteredLink(copy_s)
    streamer = Streamer(list(range(layers)), slots=layers, transport=link, clock=lambda: link.now)
    passes = decode(streamer, link, layers, iterations=3, draft_s=4 * copy_s, compute_s=0.1)
    assert all(stall > 0 for stall, _ in passes[1:])  # 4 s of drafting stage 4 layers; the rest is waited for
    assert all(idle == 0.0 for _, idle in passes)  # but the link never rested


class GatedStore:
    """A file-like store: consecutive layers follow each other; the first read waits for a gate,
    so the loads queued meanwhile can be coalesced."""

    def __init__(self, nbytes: int) -> None:
        self.size = nbytes
        self.gate = threading.Event()
        self.runs: list[list[int]] = []

    def follows(self, previous, layer):
        return layer == previous + 1

    def read_run(self, layers, stagings):
        if not self.runs:
            assert self.gate.wait(HANG_S), "the test never opened the gate"
        self.runs.append(list(layers))
        return stagings

    def nbytes(self, layer):
        return self.size


def test_loads_queued_together_are_read_in_one_request_up_to_the_coalescing_size():
    store = GatedStore(100)
    slots = [torch.zeros(8, dtype=torch.uint8) for _ in range(8)]
    transport = ThreadTransport(store, slots, HostMover(slots), coalesce_bytes=300)
    streamer = Streamer(list(range(8)), slots=8, transport=transport)  # queues layers 0..7 at once
    store.gate.set()
    streamer.drain()
    transport.close()
    # the first read took layer 0 alone (nothing else was queued yet, or it took more: both are
    # fine); every later request holds consecutive layers, at most 3 (300 bytes)
    assert [layer for run in store.runs for layer in run] == list(range(8))
    assert all(run == list(range(run[0], run[0] + len(run))) and len(run) <= 3 for run in store.runs)
    assert len(store.runs) < 8 and transport.requests == len(store.runs)
    assert transport.stats().bytes == 800


def test_a_wrap_around_is_not_coalesced():
    store = GatedStore(100)
    assert not store.follows(7, 0)  # the order's end and start are not contiguous in the file
    slots = [torch.zeros(8, dtype=torch.uint8) for _ in range(4)]
    transport = ThreadTransport(store, slots, HostMover(slots), coalesce_bytes=10**9)
    streamer = Streamer([2, 3], slots=2, transport=transport)
    store.gate.set()
    for _ in range(3):
        for layer in (2, 3):
            streamer.release(streamer.acquire(layer))
    streamer.drain()
    transport.close()
    assert all(run in ([2], [3], [2, 3]) for run in store.runs)


def test_closing_the_transport_after_a_failed_read_stops_its_thread():
    class BrokenStore(GatedStore):
        def read_run(self, layers, stagings):
            raise OSError("disk gone")

    slots = [torch.zeros(8, dtype=torch.uint8) for _ in range(3)]
    transport = ThreadTransport(BrokenStore(8), slots, HostMover(slots))
    streamer = Streamer([0, 1, 2], slots=3, transport=transport)
    with pytest.raises(OSError, match="disk gone"):
        streamer.acquire(0)
    transport.close()
    transport.close()  # twice is fine
    assert not transport.thread.is_alive()
