"""The pieces of streaming by expert (a MoE layer's layout in head and expert units:
tests/checkpoint/test_layer_layout.py): reading byte ranges from the stores, expert fetches ahead
of the ring's loads, and which experts a slot holds."""

import threading
from collections import Counter

import torch
from helpers.layer_specs import SPECS, UNIT_OF, tensors
from helpers.links import VirtualLink

from specchat.checkpoint.layout import lay_out
from specchat.offload.direct_io import ALIGN, aligned_empty
from specchat.offload.expert_cache import ExpertCache, counts_path, read_counts, write_counts
from specchat.offload.experts import FETCH_RUN_BYTES, ExpertLoads, SlotExperts, runs
from specchat.offload.storage import DiskStore, RamStore
from specchat.offload.streamer import Streamer
from specchat.offload.transport import HostMover, ThreadTransport


def test_both_stores_read_an_experts_unit_into_its_own_place(tmp_path):
    layout = lay_out(SPECS, UNIT_OF)
    disk = DiskStore([layout], tmp_path / "m.layers", {})
    ram = RamStore({0: layout}, pin=False)
    for store in (disk, ram):
        store.begin_writing()
        store.write(0, tensors())
        store.finish_writing()
        store.open()
        staging = aligned_empty(3 * ALIGN).fill_(7)
        (start, end), = [layout.units[1]]
        host, = store.read_ranges(0, [(start, end)], staging)
        place = torch.zeros(3 * ALIGN, dtype=torch.uint8)
        place[start:end] = host
        expert = {name: view for name, view in layout.views(place).items() if UNIT_OF.get(name) == 1}
        assert all(torch.equal(view, tensors()[name]) for name, view in expert.items()) and len(expert) == 2
        store.close()
    # the disk read landed in the staging at the unit's place, and nothing before it was written
    assert torch.equal(staging[:start], torch.full((start,), 7, dtype=torch.uint8))


def test_runs_group_consecutive_experts_up_to_the_request_size():
    units = tuple((i * ALIGN, i * ALIGN + 10) for i in range(6))
    assert runs([0, 1, 3, 4, 5], units) == [[0, 1], [3, 4, 5]]
    big = tuple((i * FETCH_RUN_BYTES, (i + 1) * FETCH_RUN_BYTES - 1) for i in range(3))
    assert runs([0, 1, 2], big) == [[0], [1], [2]]
    # a run spans from its first unit's start to its last unit's end: FETCH_RUN_BYTES at most
    half, start = FETCH_RUN_BYTES // 2, ALIGN
    edge = ((start, start + half), (start + half, start + 2 * half), (start + 2 * half, start + 2 * half + 1))
    assert runs([0, 1, 2], edge) == [[0, 1], [2]]


def test_a_slot_forgets_its_experts_when_another_layer_enters_it():
    held = SlotExperts()
    held.enter(0, 5).update({1, 2})
    assert held.enter(0, 5) == {1, 2}  # the same layer again: its experts are still there
    assert held.enter(1, 5) == set()  # another slot
    assert held.enter(0, 6) == set() and held.enter(0, 5) == set()


class RecordingStreamer:
    def __init__(self) -> None:
        self.fetched: list[list[tuple[int, int]]] = []
        self.waited: list[int] = []

    def fetch(self, layer, slot, ranges):
        self.fetched.append(ranges)
        return len(self.fetched) - 1

    def wait(self, ticket):
        self.waited.append(ticket)


def test_a_call_fetches_the_experts_its_slot_lacks_and_marks_them_held():
    units = tuple((i * ALIGN, i * ALIGN + 10) for i in range(4))
    streamer, held = RecordingStreamer(), {1}
    loads = ExpertLoads(streamer, layer=3, slot=0, buffer=torch.zeros(4 * ALIGN, dtype=torch.uint8), units=units,
                        held=held)
    loads.start([0, 1, 2])
    assert streamer.fetched == [[units[0]], [units[2]]]  # 0 and 2 are not consecutive once 1 is held
    loads.wait(0)
    loads.wait(1)  # held already: nothing to wait for
    assert streamer.waited == [0] and held == {0, 1}
    loads.settle()  # waits out expert 2's load, but only a wait marks it held
    assert streamer.waited == [0, 1] and held == {0, 1}


class GatedRanges:
    """A store whose first read waits for a gate; it records each read in order."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.reads: list[tuple] = []

    def read_run(self, layers, stagings):
        assert self.gate.wait(30)
        self.reads.append(("layers", *layers))
        return stagings

    def read_ranges(self, layer, ranges, staging):
        assert self.gate.wait(30)
        self.reads.append(("ranges", layer, *ranges))
        return [staging[start:end] for start, end in ranges]

    def follows(self, previous, layer):
        return layer == previous + 1

    def nbytes(self, layer):
        return 100


def test_a_fetch_goes_before_the_queued_ring_loads_and_a_head_moves_alone():
    store = GatedRanges()
    slots = [torch.zeros(200, dtype=torch.uint8) for _ in range(3)]
    transport = ThreadTransport(store, slots, HostMover(slots), heads={1: 40})
    streamer = Streamer([0, 1, 2], slots=3, transport=transport)  # queues 0 (taken at once), 1 and 2
    ticket = streamer.fetch(0, 0, [(64, 90)])
    store.gate.set()
    streamer.wait(ticket)
    streamer.drain()
    transport.close()
    # layer 0's read may have begun before the fetch was queued; the fetch then jumps layers 1 and 2,
    # and layer 1, streamed by expert, moves only its head: never coalesced with its neighbours
    assert store.reads.index(("ranges", 0, (64, 90))) < store.reads.index(("ranges", 1, (0, 40)))
    assert ("layers", 2) in store.reads
    moved = transport.stats()
    assert moved.bytes == 100 + 40 + 100 + 26 and moved.fetched_bytes == 26


def unit(value: int) -> torch.Tensor:
    return torch.full((10,), value, dtype=torch.uint8)


def test_the_cache_takes_free_places_then_replaces_only_an_expert_routed_to_less():
    cache = ExpertCache(places=2, unit_bytes=16, device=torch.device("cpu"))
    cache.count(0, [1, 2, 3])
    cache.offer(0, 1, unit(1))
    cache.offer(0, 2, unit(2))
    assert torch.equal(cache.find(0, 2)[:10], unit(2)) and cache.find(0, 3) is None
    assert [cache.find(0, expert).numel() for expert in (1, 2)] == [16, 16]  # each its own place, no more
    cache.offer(0, 3, unit(3))  # routed to as often as those cached: it does not displace them
    assert set(cache.places) == {(0, 1), (0, 2)}
    cache.count(0, [3])
    cache.count(0, [1])
    cache.offer(0, 3, unit(3))  # now more than expert 2: it takes expert 2's place
    assert set(cache.places) == {(0, 1), (0, 3)} and torch.equal(cache.find(0, 3)[:10], unit(3))
    assert cache.most_routed() == [(0, 1), (0, 3)]


def test_an_empty_cache_keeps_nothing():
    cache = ExpertCache(places=0, unit_bytes=16, device=torch.device("cpu"))
    cache.count(0, [1])
    cache.offer(0, 1, unit(1))
    assert cache.find(0, 1) is None and cache.most_routed() == []


def test_routing_counts_are_kept_beside_the_layer_file(tmp_path):
    path = counts_path(tmp_path / "model-bfloat16.layers")
    assert path == tmp_path / "model-bfloat16.routes.json" and read_counts(path) == Counter()
    write_counts(path, Counter({(3, 7): 5, (0, 1): 2}))
    assert read_counts(path) == Counter({(3, 7): 5, (0, 1): 2})
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no partial file left behind


def test_routing_counts_make_their_folder_where_no_layer_file_was_written(tmp_path):
    """A MoE target held in RAM writes no layer file: its offload folder may not exist yet."""
    path = counts_path(tmp_path / "offload" / "fresh" / "model-bfloat16.layers")
    write_counts(path, Counter({(1, 2): 3}))
    assert read_counts(path) == Counter({(1, 2): 3})


def test_the_cache_is_one_buffer_of_its_places_bytes_on_its_device():
    cache = ExpertCache(places=3, unit_bytes=16, device=torch.device("meta"))
    assert (cache.buffer.dtype, cache.buffer.numel(), cache.buffer.device.type) == (torch.uint8, 48, "meta")


def test_a_call_takes_a_cached_expert_from_the_device_and_offers_a_fetched_one():
    units = tuple((i * ALIGN, i * ALIGN + 10) for i in range(3))
    cache = ExpertCache(places=3, unit_bytes=ALIGN, device=torch.device("cpu"))
    cache.count(5, [1])
    cache.offer(5, 1, unit(9))
    streamer, held = RecordingStreamer(), set()
    buffer = torch.zeros(3 * ALIGN, dtype=torch.uint8)
    loads = ExpertLoads(streamer, layer=5, slot=0, buffer=buffer, units=units, held=held, cache=cache)
    loads.start([1, 2])
    assert streamer.fetched == [[units[2]]] and torch.equal(buffer[ALIGN:ALIGN + 10], unit(9)) and held == {1}
    buffer[2 * ALIGN:2 * ALIGN + 10] = 4  # the fetch lands
    loads.wait(2)
    assert torch.equal(cache.find(5, 2)[:10], unit(4)) and cache.counts[(5, 2)] == 1 and cache.counts[(5, 1)] == 2


class VirtualFetches(VirtualLink):
    """tests/helpers/links.py's virtual link with ring loads done at once, and a fetch done
    `fetch_s` later on the same clock."""

    def __init__(self, fetch_s: float) -> None:
        super().__init__(copy_s=0.0)
        self.fetch_s = fetch_s

    def fetch(self, layer, slot, ranges):
        return self.now + self.fetch_s


def test_waits_for_fetched_experts_are_a_stall_counted_apart():
    link = VirtualFetches(fetch_s=0.25)
    streamer = Streamer([0, 1], slots=2, transport=link, clock=lambda: link.now)
    slot = streamer.acquire(0)
    streamer.wait(streamer.fetch(0, slot, [(4096, 5000)]))
    link.now += 1.0  # compute
    streamer.release(slot)
    moved = streamer.stats()
    assert moved.fetch_wait_s == 0.25 and moved.stall_s == 0.25  # the ring's load waited for nothing
