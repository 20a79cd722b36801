"""A `generate --trace` file summed up: per traced iteration and per span (draft, pass, verify), the
host's seconds, how long the device computed (kernels on any stream, overlaps counted once), how
long the link brought weights in (host->device copies) and how many bytes, and how long the device
did neither; then the kernels that took the most device time in each span, and the host's ops
that ran while the device sat idle there. Each span ends at a
synchronized clock reading (decoding/specexec.py), so the device work launched in a span runs
inside it; what runs across a boundary is cut at it. Times in the trace are microseconds."""

import gzip
import json
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from specchat.tracing import SPAN_PREFIX

STEP_PREFIX = "ProfilerStep#"
KERNEL, COPY, HOST_OP = "kernel", "gpu_memcpy", "cpu_op"
HOST_TO_DEVICE = "HtoD"  # in a copy's name: "Memcpy HtoD (Pinned -> Device)"

Interval = tuple[float, float]


@dataclass(frozen=True)
class SpanFigures:
    """One span of one iteration, in ms (bytes in GB)."""

    step: int
    span: str
    host_ms: float
    compute_ms: float  # kernels running, on any stream
    link_ms: float  # host->device copies running
    link_gb: float
    idle_ms: float  # neither


def read_trace(path: Path) -> list[dict]:
    """The trace's complete events ("ph": "X")."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as file:
        events = json.load(file)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def summarize_trace(events: list[dict]) -> list[SpanFigures]:
    """Every span of every traced iteration, in order."""
    steps = [(int(e["name"][len(STEP_PREFIX):]), interval(e)) for e in events if e["name"].startswith(STEP_PREFIX)]
    spans = [(e["name"][len(SPAN_PREFIX):], interval(e)) for e in events
             if e["name"].startswith(SPAN_PREFIX) and e.get("cat") == "user_annotation"]
    kernels = [interval(e) for e in events if e.get("cat") == KERNEL]
    copies = [e for e in events if e.get("cat") == COPY and HOST_TO_DEVICE in e["name"]]
    figures = []
    for step, bounds in sorted(steps):
        for name, (start, end) in spans:
            if bounds[0] <= start < bounds[1]:
                figures.append(span_figures(step, name, (start, end), kernels, copies))
    return figures


def span_figures(step: int, name: str, bounds: Interval, kernels: list[Interval], copies: list[dict]) -> SpanFigures:
    compute = clipped(kernels, bounds)
    link = clipped([interval(e) for e in copies], bounds)
    moved = sum(e["args"].get("bytes", 0) * share(interval(e), bounds) for e in copies)
    busy = covered(compute + link)
    return SpanFigures(step, name, (bounds[1] - bounds[0]) / 1e3, covered(compute) / 1e3, covered(link) / 1e3,
                       moved / 1e9, (bounds[1] - bounds[0] - busy) / 1e3)


def top_kernels(events: list[dict], span: str, count: int) -> list[tuple[str, int, float]]:
    """The `count` kernels with the most device time inside `span` over the traced iterations:
    (name, calls, ms) each per iteration."""
    bounds = span_bounds(events, span)
    return busiest([e for e in events if e.get("cat") == KERNEL], bounds, len(bounds), count)


def idle_host_ops(events: list[dict], span: str, count: int,
                  least_gap_us: float = 50.0) -> list[tuple[str, int, float]]:
    """What the host ran while the device sat idle inside `span`: the `count` outermost host ops
    (each thread's ops not inside another) with the most time in the device's gaps of at least
    `least_gap_us` (neither a kernel nor a copy running), (name, calls, ms) each per iteration.
    On a GPU these are what a step or a pass waits for: launches, syncs, host-side bookkeeping."""
    bounds = span_bounds(events, span)
    busy = sorted(interval(e) for e in events if e.get("cat") in (KERNEL, COPY))
    gaps = [gap for b in bounds for gap in idle_gaps(clipped(busy, b), b) if gap[1] - gap[0] >= least_gap_us]
    return busiest(outermost([e for e in events if e.get("cat") == HOST_OP]), gaps, len(bounds), count)


def span_bounds(events: list[dict], span: str) -> list[Interval]:
    """Each traced iteration's interval of `span`."""
    return [interval(e) for e in events if e["name"] == SPAN_PREFIX + span and e.get("cat") == "user_annotation"]


def busiest(items: list[dict], windows: list[Interval], iterations: int, count: int) -> list[tuple[str, int, float]]:
    """The `count` names among `items` with the most time inside `windows` (disjoint): (name, calls,
    ms), each over `iterations`."""
    calls, micros = defaultdict(int), defaultdict(float)
    windows = sorted(windows)
    ends = [end for _, end in windows]
    for item in items:
        inside = time_inside(interval(item), windows, ends)
        if inside > 0:
            calls[item["name"]] += 1
            micros[item["name"]] += inside
    ranked = sorted(micros, key=micros.get, reverse=True)[:count]
    return [(name, round(calls[name] / iterations), micros[name] / iterations / 1e3) for name in ranked]


def time_inside(span: Interval, windows: list[Interval], ends: list[float]) -> float:
    """The time of `span` inside `windows` (disjoint and sorted, `ends` theirs): only the windows
    from the first that ends after the span starts to the last that starts before it ends are
    read: summing over all of them, the H200's traced pair reply of 2026-12-04 (337,000 events,
    thousands of idle gaps) took 163 s to sum up here and ran its check out of time; now 9 s."""
    total, index = 0.0, bisect_right(ends, span[0])
    while index < len(windows) and windows[index][0] < span[1]:
        total += overlap(span, windows[index])
        index += 1
    return total


def idle_gaps(busy: list[Interval], bounds: Interval) -> list[Interval]:
    """The stretches of `bounds` that no interval of `busy` covers."""
    gaps, reach = [], bounds[0]
    for start, end in sorted(busy):
        if start > reach:
            gaps.append((reach, start))
        reach = max(reach, end)
    return gaps + ([(reach, bounds[1])] if reach < bounds[1] else [])


def outermost(ops: list[dict]) -> list[dict]:
    """The ops no other op of their thread contains (a trace nests an op's callees inside it)."""
    kept, reach = [], {}
    for op in sorted(ops, key=lambda e: (e.get("tid"), float(e["ts"]), -float(e["dur"]))):
        start, end = interval(op)
        if start >= reach.get(op.get("tid"), float("-inf")):
            kept.append(op)
            reach[op.get("tid")] = end
    return kept


def interval(event: dict) -> Interval:
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def overlap(a: Interval, b: Interval) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def share(a: Interval, b: Interval) -> float:
    """The part of `a` inside `b` (a copy's bytes are counted by its time in the span)."""
    return overlap(a, b) / (a[1] - a[0]) if a[1] > a[0] else float(b[0] <= a[0] < b[1])


def clipped(intervals: list[Interval], bounds: Interval) -> list[Interval]:
    return [(max(s, bounds[0]), min(e, bounds[1])) for s, e in intervals if overlap((s, e), bounds) > 0]


def covered(intervals: list[Interval]) -> float:
    """The length of the intervals' union: streams that overlap are counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summary_text(events: list[dict], spans: tuple[str, ...], kernels: int) -> str:
    """The figures' table, then each span's `kernels` busiest kernels (a trace made on a CPU has none)."""
    tables = [figures_table(summarize_trace(events))]
    if not any(e.get("cat") == KERNEL for e in events):
        return "\n\n".join([*tables, "no device kernels in the trace: a CPU's run has host times alone"])
    per_span = [table for span in spans for table in (
        kernels_table(top_kernels(events, span, kernels), span, "kernel"),
        kernels_table(idle_host_ops(events, span, kernels), span, "host op while the device idled"))]
    return "\n\n".join([*tables, *per_span])


def figures_table(figures: list[SpanFigures]) -> str:
    rows = [f"| {f.step} | {f.span} | {f.host_ms:.1f} | {f.compute_ms:.1f} | {f.link_ms:.1f} | {f.link_gb:.2f} "
            f"| {f.idle_ms:.1f} |" for f in figures]
    return "\n".join(["| iteration | span | host ms | device computing ms | link copying ms | GB copied | device "
                      "idle ms |", "|---|---|---|---|---|---|---|", *rows])


def kernels_table(kernels: list[tuple[str, int, float]], span: str, what: str) -> str:
    rows = [f"| {name[:90].replace('|', '/')} | {calls} | {ms_each:.2f} |" for name, calls, ms_each in kernels]
    return "\n".join([f"| {span}: {what} | calls an iteration | ms an iteration |", "|---|---|---|", *rows])
