"""CUDA is timed as CUDA, checked on CPU with stand-ins: every timed region ends with a
synchronize of the device before the clock is read (the probe, the engines' events), the link's
busy time leaves out the loader's waits for compute, and the stall is timed on the compute
stream, so a host blocked while the device still computes earlier layers counts no stall."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from specchat import device_clock
from specchat.decoding import specexec
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.probe import REPEATS, time_pass
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.offload import cuda as cuda_module
from specchat.offload.build import stall_meter
from specchat.offload.cuda import CudaStallMeter, free_bytes
from specchat.offload.stall import HostStallMeter
from specchat.offload.streamer import Streamer
from specchat.offload.transport import ThreadTransport
from specchat.transfer import TransferStats

CUDA = torch.device("cuda")
GREEDY = SamplingParams(0.0, 1.0, 0)


@pytest.fixture
def log(monkeypatch) -> list:
    """What the clock module asks of CUDA and of the clock, in order; the clock ticks 1 s a read,
    so a timed figure is a whole number of seconds when it comes from the synchronized clock."""
    entries: list = []
    ticks = itertools.count()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: entries.append(("sync", device)))
    monkeypatch.setattr(device_clock, "perf_counter", lambda: entries.append("clock") or float(next(ticks)))
    return entries


class OnFakeCuda:
    """A tiny CPU model that says it lives on CUDA; its transfer counters are logged when read."""

    def __init__(self, lm, log: list) -> None:
        self.lm, self.log = lm, log

    @property
    def device(self) -> torch.device:
        return CUDA

    def transfer_stats(self) -> TransferStats:
        self.log.append("stats")
        return self.lm.transfer_stats()

    def __getattr__(self, name: str):
        return getattr(self.lm, name)


def clock_reads_follow_a_sync(log: list) -> bool:
    return all(i > 0 and log[i - 1] == ("sync", CUDA) for i, entry in enumerate(log) if entry == "clock")


def stats_follow_a_clock_read(log: list) -> bool:
    return all(log[i - 1] == "clock" for i, entry in enumerate(log) if entry == "stats")


def test_now_synchronizes_each_cuda_device_once_then_reads_the_clock(log):
    second = torch.device("cuda", 1)
    assert device_clock.now(CUDA, torch.device("cpu"), CUDA, second) == 0.0
    assert log == [("sync", CUDA), ("sync", second), "clock"]


def test_now_on_cpu_only_reads_the_clock(log):
    device_clock.now(torch.device("cpu"))
    assert log == ["clock"]


def test_the_probe_synchronizes_before_each_clock_read_and_reads_the_counters_after(log, tiny_target):
    seconds, _, whole = time_pass(OnFakeCuda(tiny_target, log), 4, run_head=False)
    assert seconds == 1.0 and not whole  # two adjacent ticks: the synchronized clock, nothing else; nothing streams
    assert log.count("clock") == 2 * REPEATS and clock_reads_follow_a_sync(log) and stats_follow_a_clock_read(log)


def test_autoregressive_events_are_timed_on_the_synchronized_clock(log, tiny_target):
    events = list(AutoregressiveEngine(OnFakeCuda(tiny_target, log), []).generate([1, 2, 3], 3, GREEDY))
    assert [event.target_s for event in events] == [1.0, 1.0, 1.0]
    assert clock_reads_follow_a_sync(log) and stats_follow_a_clock_read(log)


def test_tree_engine_events_time_draft_target_and_wall_on_the_synchronized_clock(log, tiny_target, tiny_draft,
                                                                                 monkeypatch):
    # a step's mask is made where the draft's `send` puts its lineages: the fake's model's, this CPU
    score = specexec.score  # and the pass's on the target's
    monkeypatch.setattr(specexec, "score", lambda target, *rest, **named: score(target.lm, *rest, **named))
    engine = TreeEngine(SPECEXEC, OnFakeCuda(tiny_target, log), OnFakeCuda(tiny_draft, log), [],
                        TreeShape(budget=4, max_depth=2))
    first, *later = list(engine.generate([1, 2, 3], 6, GREEDY))
    assert first.target_s == 1.0 and later
    # one synchronized reading inside each: drafting's after the catch-up, the target's after the pass
    assert all((event.draft_s, event.target_s, event.pass_s) == (2.0, 2.0, 1.0) for event in later)
    # target and draft both say cuda: one synchronize of that device per reading; the counters'
    # first reading is the reply's starting mark, before any pass
    assert log[0] == "stats" and clock_reads_follow_a_sync(log) and stats_follow_a_clock_read(log[1:])


class SimulatedCuda:
    """One compute stream on a virtual timeline, as CUDA runs it: work queued on it starts once
    the work before it is done and not before the host queued it; an event completes when the
    stream reaches it."""

    def __init__(self) -> None:
        self.host_now = 0.0
        self.stream_free_at = 0.0
        outer = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at: float | None = None

            def record(self, stream) -> None:
                self.at = outer.stream_free_at = max(outer.stream_free_at, outer.host_now)

            def query(self) -> bool:
                return self.at is not None and self.at <= outer.host_now

            def elapsed_time(self, end) -> float:
                assert self.query() and end.query(), "CUDA refuses to time an event that has not completed"
                return (end.at - self.at) * 1000

        self.Event = Event

    def current_stream(self, device=None):
        return "compute"

    def compute(self, seconds: float) -> None:
        """The host queues `seconds` of kernels."""
        self.stream_free_at = max(self.stream_free_at, self.host_now) + seconds


@pytest.fixture
def simulated(monkeypatch) -> SimulatedCuda:
    fake = SimulatedCuda()
    monkeypatch.setattr(cuda_module.torch, "cuda", fake)
    return fake


def wait(meters, cuda: SimulatedCuda, host_blocks_until: float) -> None:
    """Compute waits for a layer; the host stays blocked until the copy is done."""
    marks = [meter.start() for meter in meters]
    cuda.host_now = host_blocks_until
    for meter, mark in zip(meters, marks):
        meter.stop(mark)


def test_a_host_blocked_while_the_device_computes_earlier_layers_is_no_stall(simulated):
    cuda_meter, host_meter = CudaStallMeter(CUDA), HostStallMeter(lambda: simulated.host_now)
    simulated.compute(5.0)  # five earlier layers queued: the stream is busy until t=5
    simulated.host_now = 1.0
    wait([cuda_meter, host_meter], simulated, host_blocks_until=4.0)  # the copy lands at t=4
    simulated.host_now = 6.0
    assert cuda_meter.seconds() == 0.0  # the weights were there before compute needed them
    assert host_meter.seconds() == 3.0  # what the host clock called a stall: compute, not waiting


def test_weights_that_arrive_after_compute_is_ready_stall_the_stream_by_the_difference(simulated):
    meter = CudaStallMeter(CUDA)
    simulated.compute(2.0)  # ready for the next layer at t=2
    simulated.host_now = 1.0
    wait([meter], simulated, host_blocks_until=6.0)  # the copy lands at t=6
    assert meter.seconds() == 4.0


def test_a_wait_the_stream_has_not_reached_is_counted_once_it_has(simulated):
    meter = CudaStallMeter(CUDA)
    simulated.compute(10.0)
    wait([meter], simulated, host_blocks_until=2.0)
    assert meter.seconds() == 0.0 and len(meter.pending) == 1  # not timed: CUDA would refuse
    simulated.host_now = 10.0
    assert meter.seconds() == 0.0 and not meter.pending


def test_waits_the_stream_has_got_past_are_counted_as_new_ones_come(simulated):
    """No one need read the stall for the events to be let go: each new wait collects the old."""
    meter = CudaStallMeter(CUDA)
    for _ in range(100):
        simulated.compute(1.0)
        wait([meter], simulated, host_blocks_until=simulated.stream_free_at + 0.5)  # each copy lands 0.5 s late
    assert len(meter.pending) <= 1 and meter.seconds() == pytest.approx(50.0)


def test_the_streamer_meters_each_wait_for_a_layer_and_reports_the_meter():
    log = []

    class Meter:
        def start(self):
            log.append("start")
            return len(log)

        def stop(self, mark):
            log.append(("stop", mark))

        def seconds(self):
            return 7.0

    class Transport:
        def begin(self, layer, slot, whole=False):
            return layer

        def finish(self, ticket):
            log.append(("finish", ticket))

        def retire(self, slot):
            pass

        def stats(self):
            return TransferStats()

    streamer = Streamer([0, 1], slots=2, transport=Transport(), meter=Meter(), start_meter=Meter())
    streamer.acquire(0)  # the pass's first streamed layer: the start meter's
    streamer.acquire(1)
    assert log == ["start", ("finish", 0), ("stop", 1), "start", ("finish", 1), ("stop", 4)]
    assert streamer.stats().stall_s == 14.0 and streamer.stats().start_stall_s == 7.0


def test_the_link_is_not_busy_while_the_loader_waits_for_compute_to_free_a_slot():
    now = [0.0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    class Store:
        def read_run(self, layers, stagings):
            advance(2.0)  # the read
            return [torch.zeros(4, dtype=torch.uint8) for _ in layers]

        def nbytes(self, layer):
            return 4

        def follows(self, previous, layer):
            return False

    class Mover:
        def wait_free(self, slot):
            advance(10.0)  # compute still holds the slot

        def issue(self, slot, host):
            advance(1.0)  # the copy

        def settle(self, slot):
            pass

        def wait_loaded(self, slot):
            pass

    transport = ThreadTransport(Store(), [None], Mover(), clock=lambda: now[0])
    transport.finish(transport.begin(0, 0, whole=False))
    transport.close()
    assert transport.stats() == TransferStats(4, 3.0)  # read + copy, not the 10 s wait


def test_the_stall_is_timed_on_the_compute_stream_on_cuda_and_by_the_host_clock_on_cpu():
    assert isinstance(stall_meter(CUDA), CudaStallMeter)
    assert stall_meter(torch.device("cpu")) is None  # the streamer's own host clock


def test_free_memory_is_asked_of_an_indexed_device(monkeypatch):
    asked = []
    fake = SimpleNamespace(current_device=lambda: 3, mem_get_info=lambda index: asked.append(index) or (5, 9))
    monkeypatch.setattr(cuda_module.torch, "cuda", fake)
    assert free_bytes(CUDA) == 5 and free_bytes(torch.device("cuda", 1)) == 5
    assert asked == [3, 1]  # torch before 2.5 rejects a device without an index
