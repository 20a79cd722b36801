"""How quant's startup probes time their candidates, and what a probe's shape means.

Every probe (quant/widths.py) decides between two products by `faster`, at one width or across a
sweep of widths (`crossover`, `widest_win`). A test stands in for the timer by replacing `faster`
here: the probes call it through this module (`timing.faster`, or the sweeps below), so that one
replacement reaches every probe's decision.

A busy machine must not decide a choice that is kept for good (machine_choices.py): other work
only ever adds time to a trial, so each candidate counts its fastest trial; the trials go in
turns, first-second then second-first (a load that comes and goes every other trial, as a build's
jobs do, cannot then fall on one candidate's trials alone); and a candidate wins only where its
margin beats the trials' spread, the gap between a candidate's two fastest trials, taking more
trials (up to MAX_RUNS) while it does not. A margin no wider than the noise is no win.

A probe's shape is a `LinearShape`: nn.Linear's (in_features, out_features), so the weight it
times is [out_features, in_features] and its inputs are [rows, in_features].
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from specchat.cuda_graph import replayed
from specchat.device_clock import now

RUNS = 3  # timed calls of each candidate at least; the fastest counts
MAX_RUNS = 9  # at most, while the margin between two candidates does not beat their spread


class LinearShape(NamedTuple):
    """A probed linear in nn.Linear's argument order: weight [out_features, in_features]."""

    in_features: int
    out_features: int


def best_seconds(runs: Sequence[Callable[[], object]], device: torch.device) -> list[float]:
    """The fastest of RUNS timed calls of each of `runs`, in seconds, after one untimed call of
    each (`trials`)."""
    return [min(times) for times in trials(runs, device, RUNS)]


def trials(runs: Sequence[Callable[[], object]], device: torch.device, rounds: int,
           earlier: Sequence[list[float]] | None = None) -> list[list[float]]:
    """`rounds` more timed calls of each of `runs` (after `earlier`'s; none: after one untimed
    call of each, which takes first-call costs, kernel selection and allocations, out of the
    timing), in seconds. A round calls them in order, the next in reverse, and so on, so that load
    which comes every other call falls on each candidate's calls alike; the clock is read after a
    synchronize of `device` (device_clock.now), so that CUDA's queued work is timed rather than its
    launch. Without autograd: a probe times inference."""
    times = [list(done) for done in earlier] if earlier is not None else [[] for _ in runs]
    with torch.inference_mode():
        if earlier is None:
            for run in runs:
                run()
        for round_index in range(len(times[0]), len(times[0]) + rounds):
            order = range(len(runs)) if round_index % 2 == 0 else reversed(range(len(runs)))
            for index in order:
                start = now(device)
                runs[index]()
                times[index].append(now(device) - start)
    return times


def spread(times: Sequence[float]) -> float:
    """The gap between a candidate's two fastest trials: how far its fastest is from noise-free."""
    fastest, second = sorted(times)[:2]
    return second - fastest


def faster(first: Callable[[], object], second: Callable[[], object], device: torch.device) -> bool:
    """Whether `first` runs faster than `second` on `device` by more than the trials' spread
    (RUNS trials each, more up to MAX_RUNS while the margin does not beat it); a tie, or a margin
    within the noise, is no win."""
    times = trials((first, second), device, RUNS)
    while not decided(times) and len(times[0]) < MAX_RUNS:
        times = trials((first, second), device, 1, times)
    return decided(times) and min(times[0]) < min(times[1])


def decided(times: Sequence[Sequence[float]]) -> bool:
    """Whether the fastest trials of two candidates are further apart than either one's spread."""
    return abs(min(times[0]) - min(times[1])) > max(spread(times[0]), spread(times[1]))


def crossover(widths: Sequence[int], candidate: Callable[[int], object], current: Callable[[int], object],
              device: torch.device) -> int | None:
    """The first of `widths` (rows) at which `candidate(rows)` runs faster than `current(rows)`;
    None where it never does. Widths after the first win are not timed."""
    return next((rows for rows in widths if faster(lambda: candidate(rows), lambda: current(rows), device)), None)


def widest_win(widths: Sequence[int], candidate: Callable[[int], object], current: Callable[[int], object],
               device: torch.device) -> int:
    """The widest of `widths` (rows, ascending) up to which `candidate(rows)` runs faster than
    `current(rows)` at every width; 0 where it loses at the first. The candidate is to serve every
    input up to one width, so a win past a loss does not count and the sweep stops at the first loss."""
    wins = 0
    for rows in widths:
        if not faster(lambda: candidate(rows), lambda: current(rows), device):
            break
        wins = rows
    return wins


def winning_span(widths: Sequence[int], candidate: Callable[[int], object], current: Callable[[int], object],
                 device: torch.device) -> tuple[int, int] | None:
    """The first of `widths` (rows, ascending) at which `candidate(rows)` runs faster than
    `current(rows)` and the widest of the run of wins that follows it; None where it never wins.
    A win past the run's first loss does not count, and the sweep stops there."""
    first = crossover(widths, candidate, current, device)
    if first is None:
        return None
    rest = [rows for rows in widths if rows > first]
    return first, widest_win(rest, candidate, current, device) or first


def as_replayed(product: Callable[[int], object], device: torch.device) -> Callable[[int], object]:
    """`product(rows)` as a captured step runs it: on CUDA replayed from a graph captured at each
    width's first call (which the trials leave untimed), so that a kernel is timed without its
    launch's host costs; elsewhere `product` itself."""
    if device.type != "cuda":
        return product
    graphs: dict[int, Callable[[], object]] = {}
    return lambda rows: (graphs.get(rows) or graphs.setdefault(rows, replayed(lambda: product(rows), device)))()
