"""The clock read around device work, the same on CPU and CUDA.

CUDA queues kernels and returns at once, so a clock read right after launching a forward pass
measures the launches, not the pass. Reading the clock after a synchronize of the device measures
the work. On a CPU an op has finished when it returns: the synchronize is a no-op there, and the
CPU path reads the clock exactly as before.
"""

from time import perf_counter

import torch


def synchronize(*devices: torch.device) -> None:
    """Wait until the work queued on each CUDA device in `devices` has finished."""
    for device in dict.fromkeys(devices):  # once each, in the order given
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def now(*devices: torch.device) -> float:
    """perf_counter() once the work queued on `devices` has finished: two readings bracket the
    device time of what was launched between them."""
    synchronize(*devices)
    return perf_counter()


class Stopwatch:
    """Seconds spent inside its `with` blocks, added up. Around work that ends by bringing the
    device's results to the host (a `.cpu()`), it needs no synchronize: what lies outside the
    blocks is the host's own time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.started = 0.0

    def __enter__(self) -> "Stopwatch":
        self.started = perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += perf_counter() - self.started
