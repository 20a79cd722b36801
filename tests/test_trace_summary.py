"""A trace summed up: a span's device computing time counts overlapping streams once and stops at
the span's ends, the link's bytes follow a copy's share of time inside the span, and the busiest
kernels are per iteration."""

import gzip
import json

import pytest

from specchat.trace_summary import (
    busiest,
    covered,
    idle_gaps,
    idle_host_ops,
    outermost,
    read_trace,
    summarize_trace,
    summary_text,
    time_inside,
    top_kernels,
)


def event(name: str, cat: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def iteration(step: int, start: float) -> list[dict]:
    """One iteration at `start` us: a draft span of 1000 us, a pass of 2000; on the device two
    overlapping kernels in the draft, and in the pass a kernel and a copy that began in the draft."""
    return [
        event(f"ProfilerStep#{step}", "user_annotation", start, 3000),
        event("specchat.draft", "user_annotation", start, 1000),
        event("specchat.pass", "user_annotation", start + 1000, 2000),
        event("gemm", "kernel", start + 100, 400),
        event("norm", "kernel", start + 300, 400),  # overlaps gemm by 200 us: 600 us computing, not 800
        event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", start + 800, 800, bytes=8e8),  # 600 us in the pass
        event("gemm", "kernel", start + 1900, 1000),
    ]


EVENTS = iteration(3, 0.0) + iteration(4, 10_000.0)


def test_each_span_of_each_iteration_is_measured_within_its_ends():
    draft, passed = summarize_trace(EVENTS)[:2]
    assert (draft.step, draft.span, draft.host_ms) == (3, "draft", 1.0)
    assert draft.compute_ms == pytest.approx(0.6) and draft.link_ms == pytest.approx(0.2)
    assert draft.link_gb == pytest.approx(0.2)  # a quarter of the copy's time, a quarter of its 0.8 GB
    assert draft.idle_ms == pytest.approx(0.2)  # 100 us before gemm, 100 between norm and the copy
    assert (passed.host_ms, passed.compute_ms, passed.link_ms) == pytest.approx((2.0, 1.0, 0.6))
    assert passed.link_gb == pytest.approx(0.6) and passed.idle_ms == pytest.approx(0.4)
    assert [(f.step, f.span) for f in summarize_trace(EVENTS)] == [(3, "draft"), (3, "pass"), (4, "draft"),
                                                                  (4, "pass")]


def test_the_busiest_kernels_are_given_per_iteration():
    assert top_kernels(EVENTS, "draft", 5) == [("gemm", 1, pytest.approx(0.4)), ("norm", 1, pytest.approx(0.4))]
    assert top_kernels(EVENTS, "pass", 5) == [("gemm", 1, pytest.approx(1.0))]
    assert top_kernels(EVENTS, "verify", 5) == []


def test_the_host_ops_run_while_the_device_idled_are_the_outermost_ones_in_its_gaps():
    """In the draft (0-1000 us) the device idles 0-100 and 700-800 (the copy starts at 800): a
    lookup over 0-150 (its callee nested inside) meets 100 us of gap; a sort over 650-800, 100."""
    host = [event("aten::embedding", "cpu_op", 0, 150), event("aten::index_select", "cpu_op", 10, 100),
            event("aten::sort", "cpu_op", 650, 150), event("aten::mm", "cpu_op", 200, 100)]  # mm: device busy
    for op in host:
        op["tid"] = 1
    ops = idle_host_ops(iteration(3, 0.0) + host, "draft", 5)
    assert ops == [("aten::embedding", 1, pytest.approx(0.1)), ("aten::sort", 1, pytest.approx(0.1))]
    assert idle_host_ops(iteration(3, 0.0) + host, "draft", 5, least_gap_us=150) == []  # no gap that long


def test_gaps_and_outermost_ops():
    assert idle_gaps([(10, 20), (15, 30), (40, 50)], (0, 60)) == [(0, 10), (30, 40), (50, 60)]
    assert idle_gaps([], (0, 5)) == [(0, 5)]
    nested = [event("outer", "cpu_op", 0, 10), event("inner", "cpu_op", 2, 3), event("next", "cpu_op", 10, 5)]
    assert [op["name"] for op in outermost(nested)] == ["outer", "next"]


def test_a_spans_time_inside_disjoint_windows_reads_each_window_it_meets():
    windows = [(0, 10), (20, 30), (40, 50), (60, 70)]
    ends = [end for _, end in windows]
    assert time_inside((5, 45), windows, ends) == 5 + 10 + 5  # three windows met, the last not
    assert time_inside((10, 20), windows, ends) == 0  # between two windows, touching both
    assert time_inside((65, 100), windows, ends) == 5 and time_inside((-5, 0), windows, ends) == 0
    assert time_inside((0, 70), windows, ends) == 40


def test_the_busiest_ops_sum_their_time_over_windows_given_in_any_order():
    ops = [event("a", "cpu_op", 5, 40), event("b", "cpu_op", 61, 2), event("a", "cpu_op", 100, 5)]
    ranked = busiest(ops, [(60, 70), (40, 50), (0, 10), (20, 30)], 1, 5)  # a's second call meets no window
    assert ranked == [("a", 1, pytest.approx(0.02)), ("b", 1, pytest.approx(0.002))]


def test_a_union_counts_overlaps_once():
    assert covered([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert covered([]) == 0


def test_a_written_trace_is_read_back_and_a_cpu_run_says_it_has_no_kernels(tmp_path):
    path = tmp_path / "reply.json.gz"
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": EVENTS + [{"ph": "M", "name": "process_name"}]}, file)
    assert read_trace(path) == EVENTS  # metadata events left out
    assert "| 4 | pass | 2.0 | 1.0 | 0.6 | 0.60 | 0.4 |" in summary_text(EVENTS, ("pass",), 3)
    host_only = [e for e in EVENTS if e["cat"] == "user_annotation"]
    assert summary_text(host_only, ("pass",), 3).endswith("a CPU's run has host times alone")
