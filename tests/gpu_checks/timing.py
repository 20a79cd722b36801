"""Wall time of work on a device, synchronized: CUDA runs kernels asynchronously, so the clock is
read only after the device has finished what was issued (and before, so that earlier work is not
counted)."""

import math
from collections.abc import Callable
from time import perf_counter

import torch

from specchat.cuda_graph import replayed

RUNS = 3


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest_ms(run: Callable[[], object], device: torch.device, runs: int = RUNS) -> float:
    """The fastest of `runs` timed runs of `run`, in milliseconds, after one untimed run that
    compiles kernels and makes the width probes' measurements."""
    run()
    best = math.inf
    for _ in range(runs):
        synchronize(device)
        start = perf_counter()
        run()
        synchronize(device)
        best = min(best, perf_counter() - start)
    return best * 1e3


def mean_ms(run: Callable[[], object], device: torch.device, repeats: int, runs: int = RUNS) -> float:
    """The fastest of `runs` means over `repeats` back-to-back runs, in milliseconds, on CUDA replayed
    from one graph as a captured draft step runs them: a kernel of a few microseconds timed alone
    would time its launch (Triton's host costs tens of microseconds) and the synchronization instead."""
    return fastest_ms(replayed(lambda: [run() for _ in range(repeats)], device), device, runs) / repeats
