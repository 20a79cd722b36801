"""The CUDA mover: asynchronous host->device copies on a dedicated stream, ordered by events.

Thin on purpose: the schedule (which layer, which slot, when) is the streamer's and is tested on
CPU; this only maps the mover's three calls onto CUDA streams and events.
"""

import torch


class CudaMover:
    def __init__(self, slots: list[torch.Tensor]) -> None:
        self.slots = slots
        self.copy_stream = torch.cuda.Stream(device=slots[0].device)
        self.loaded = [torch.cuda.Event() for _ in slots]
        self.free = [torch.cuda.Event() for _ in slots]

    def move(self, slot: int, host: torch.Tensor) -> None:
        """Runs on the loader thread: copy after compute has finished with the slot, then block
        this thread until the copy is done, so the host staging buffer may be refilled."""
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(self.free[slot])
            self.slots[slot][: host.numel()].copy_(host, non_blocking=True)
            self.loaded[slot].record(self.copy_stream)
        self.loaded[slot].synchronize()

    def wait_loaded(self, slot: int) -> None:
        torch.cuda.current_stream(self.slots[slot].device).wait_event(self.loaded[slot])

    def mark_free(self, slot: int) -> None:
        self.free[slot].record(torch.cuda.current_stream(self.slots[slot].device))
