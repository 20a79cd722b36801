"""How quant's startup probes time their candidates, and what a probe's shape means.

Every probe (int8_rows, width_choice, prepack_pays, dense_rows, expand_rows) decides between two
products by `faster`, at one width or across a sweep of widths (`crossover`, `widest_win`). A
test stands in for the timer by replacing `faster` here: the probes call it through this module
(`timing.faster`, or the sweeps below), so that one replacement reaches every probe's decision.

A probe's shape is a `LinearShape`: nn.Linear's (in_features, out_features), so the weight it
times is [out_features, in_features] and its inputs are [rows, in_features].
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from specchat.device_clock import now

RUNS = 3  # timed calls of each candidate; the fastest counts


class LinearShape(NamedTuple):
    """A probed linear in nn.Linear's argument order: weight [out_features, in_features]."""

    in_features: int
    out_features: int


def best_seconds(runs: Sequence[Callable[[], object]], device: torch.device) -> list[float]:
    """The fastest of RUNS timed calls of each of `runs`, in seconds, after one untimed call of
    each. The warm-up takes first-call costs (kernel selection and compilation, allocations) out
    of the timing; the calls go in turns, so that a busy machine's stalls fall on every candidate
    alike; the clock is read after a synchronize of `device` (device_clock.now), so that CUDA's
    queued work is timed rather than its launch. Without autograd: a probe times inference."""
    best = [math.inf] * len(runs)
    with torch.inference_mode():
        for run in runs:
            run()
        for _ in range(RUNS):
            for index, run in enumerate(runs):
                start = now(device)
                run()
                best[index] = min(best[index], now(device) - start)
    return best


def faster(first: Callable[[], object], second: Callable[[], object], device: torch.device) -> bool:
    """Whether `first` runs faster than `second` on `device` (`best_seconds`); a tie is no win."""
    first_seconds, second_seconds = best_seconds((first, second), device)
    return first_seconds < second_seconds


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
