"""The stall: how long compute waited for streamed weights, and nothing else.

The streamer brackets every wait for a layer with `start` and `stop`. On a CPU compute runs on
the thread that waits, so the host clock between the two is the stall (`HostStallMeter`). On
CUDA the host runs ahead of the device: while the host blocks, the device may still be computing
the layers queued before, and that is compute, not a stall; `offload.cuda.CudaStallMeter` times
the wait on the compute stream instead.
"""

from collections.abc import Callable
from typing import Any, Protocol


class StallMeter(Protocol):
    def start(self) -> Any:
        """Compute is about to wait for a layer; returns the mark `stop` takes."""

    def stop(self, mark: Any) -> None:
        """The wait that began at `mark` is over: the layer is usable."""

    def seconds(self) -> float:
        """Cumulative seconds compute waited, over the waits measured so far."""


class HostStallMeter:
    """The host clock around each wait: right where compute is synchronous (the CPU)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.total = 0.0

    def start(self) -> float:
        return self.clock()

    def stop(self, mark: float) -> None:
        self.total += self.clock() - mark

    def seconds(self) -> float:
        return self.total
