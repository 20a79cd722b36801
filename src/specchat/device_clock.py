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
