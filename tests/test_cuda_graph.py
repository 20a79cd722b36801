"""cuda_graph on a CPU: nothing to capture, so work runs as it is (the capture itself is checked
on CUDA by the captured draft steps, gpu_checks/captured_draft.py), and a probe's replayed product
is the product; with CUDA's streams and graphs stood in for, a capture's warm-ups and the capture
run where shapes repeat, in the order CUDA requires, into the pool given."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from specchat.capture_gate import GATE
from specchat.cuda_graph import WARMUP, capture_graph, repeating_shapes, replayed, shapes_repeat
from specchat.quant.timing import as_replayed

CPU = torch.device("cpu")


def test_on_a_cpu_the_replay_is_the_run_itself():
    calls = []

    def run() -> torch.Tensor:
        calls.append(1)
        return torch.ones(1)

    assert replayed(run, CPU) is run and not calls  # nothing ran ahead: no warm-up, no capture


def test_on_a_cpu_a_probes_product_runs_at_each_width_as_called():
    widths = []

    def product(rows: int) -> torch.Tensor:
        widths.append(rows)
        return torch.ones(rows)

    replay = as_replayed(product, CPU)
    assert replay(3).shape == (3,) and replay(5).shape == (5,) and widths == [3, 5]


class RecordingStream:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def wait_stream(self, other: "RecordingStream") -> None:
        self.events.append(f"{self.name} waits for {other.name}")


class RecordingGraph:
    def replay(self) -> None:
        pass


@pytest.fixture
def cuda_events(monkeypatch) -> list[str]:
    """CUDA's streams and graphs stood in for; what capture_graph asks of them, in order."""
    events: list[str] = []
    current, side = RecordingStream("current", events), RecordingStream("side", events)

    @contextmanager
    def on(stream: RecordingStream) -> Iterator[None]:
        events.append(f"on {stream.name}")
        yield
        events.append(f"off {stream.name}")

    @contextmanager
    def capturing(graph: RecordingGraph, pool: object = None) -> Iterator[None]:
        events.append(f"capture into {pool}")
        yield

    monkeypatch.setattr(torch.cuda, "Stream", lambda: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", RecordingGraph)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    return events


def test_a_captures_warm_ups_and_the_capture_run_where_shapes_repeat_and_nothing_after(cuda_events):
    """Every run capture_graph makes, its warm-ups and the captured one, sees shapes_repeat(); the
    caller's code after it does not. The captured run holds the capture gate; the warm-ups, which
    CUDA does not capture, do not."""
    seen = []

    def run() -> torch.Tensor:
        seen.append((shapes_repeat(), GATE.capturing))
        return torch.ones(1)

    assert not shapes_repeat()
    capture_graph(run)
    # the capture alone holds the gate against other threads' device jobs (capture_gate.py)
    assert seen == [(True, False)] * WARMUP + [(True, True)] and not shapes_repeat() and not GATE.capturing


def test_repeating_shapes_ends_with_its_block_even_when_the_block_raises():
    with pytest.raises(ValueError, match="a step that failed"), repeating_shapes():
        raise ValueError("a step that failed")
    assert not shapes_repeat()


def test_a_capture_warms_up_on_a_side_stream_between_the_callers_work_and_captures_into_the_pool(cuda_events):
    """The warm-ups run on a side stream that first waits for the caller's queued work, the caller's
    stream waits for them before the capture, the capture goes into the pool given, and what the
    captured run returned (which every replay writes anew) comes back with the graph; on a CUDA
    device `replayed` gives that graph's replay."""
    def run() -> torch.Tensor:
        cuda_events.append("run")
        return torch.full((1,), float(cuda_events.count("run")))

    graph, output = capture_graph(run, pool=(1, 7))
    assert cuda_events == ["side waits for current", "on side"] + ["run"] * WARMUP + [
        "off side", "current waits for side", "capture into (1, 7)", "run"]
    assert isinstance(graph, RecordingGraph) and output.item() == WARMUP + 1  # the captured run's
    replay = replayed(run, torch.device("cuda"))
    assert isinstance(replay.__self__, RecordingGraph) and replay.__func__ is RecordingGraph.replay
