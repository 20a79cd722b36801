"""Wall time of work on a device, synchronized: CUDA runs kernels asynchronously, so the clock is
read only after the device has finished what was issued (and before, so that earlier work is not
counted)."""

import math
from collections.abc import Callable
from time import perf_counter

import torch

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
