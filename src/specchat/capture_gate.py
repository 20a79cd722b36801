"""CUDA graph captures kept apart from other threads' device work in this process.

While a stream captures, CUDA fails a synchronization of the device (or of a context holding the
capturing stream) and, in the default global capture mode, an unsafe call from any other thread
(cudaMalloc; an event's synchronize or query, as PyTorch found with NCCL's watchdog thread); the
capture is then invalidated too. The drafter captures a draft step at a shape's second use
(decoding/static_step.py) while other threads use the device: DSI's thread workers verify, each
job synchronizing the device to time itself and allocating as it runs its target, and an
offloaded target's loader thread waits on events as it moves the next pass's layers
(offload/cuda.py). So a capture waits until no such work runs and holds new work back until it
ends; the work runs side by side otherwise. Captures are a reply's first few steps of each shape,
so work rarely waits.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CaptureGate:
    """Many `work` blocks at once, or one `capture` block alone; a waiting capture goes first."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.working = 0  # work blocks running
        self.capturing = False
        self.waiting = 0  # captures waiting for the running work to end

    @contextmanager
    def work(self) -> Iterator[None]:
        """Device work that must not overlap a capture: it waits for a running or waiting one."""
        with self.changed:
            self.changed.wait_for(lambda: not self.capturing and not self.waiting)
            self.working += 1
        try:
            yield
        finally:
            with self.changed:
                self.working -= 1
                self.changed.notify_all()

    @contextmanager
    def capture(self) -> Iterator[None]:
        """A capture: it waits for the running work to end; work arriving meanwhile waits for it."""
        with self.changed:
            self.waiting += 1
            self.changed.wait_for(lambda: not self.working and not self.capturing)
            self.waiting -= 1
            self.capturing = True
        try:
            yield
        finally:
            with self.changed:
                self.capturing = False
                self.changed.notify_all()


GATE = CaptureGate()  # the process's: captures and jobs on its devices
