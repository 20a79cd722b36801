"""cuda_graph on a CPU: nothing to capture, so work runs as it is (the capture itself is checked
on CUDA by the captured draft steps, gpu_checks/captured_draft.py), and a probe's replayed product
is the product; a capture's warm-ups and the capture run where shapes repeat."""

from contextlib import nullcontext
from types import SimpleNamespace

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


def test_a_captures_warm_ups_and_the_capture_run_where_shapes_repeat_and_nothing_after(monkeypatch):
    """CUDA's streams and graphs stood in for: every run capture_graph makes, its warm-ups and the
    captured one, sees shapes_repeat(); the caller's code after it does not. The captured run
    holds the capture gate; the warm-ups, which CUDA does not capture, do not."""
    seen = []
    stream = SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda side: nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", SimpleNamespace)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: nullcontext())

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
