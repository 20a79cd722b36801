"""CUDA's capture stood in for on a CPU (decoding/static_step.py's `capture_graph`): the capture
runs the step once and a replay runs it again into the tensor the capture returned."""

from collections.abc import Callable

import torch


class FakeGraph:
    """A CUDA graph's part a CPU can play: a replay writes `run`'s output anew into the tensor the
    capture returned."""

    def __init__(self, run: Callable[[], torch.Tensor], output: torch.Tensor) -> None:
        self.run, self.output, self.replays = run, output, 0

    def replay(self) -> None:
        self.output.copy_(self.run())
        self.replays += 1


def standing_in(captured: list[FakeGraph]) -> Callable:
    """A `capture_graph(run, pool)` stand-in that keeps each graph it makes in `captured`."""

    def capture(run: Callable[[], torch.Tensor], pool) -> tuple[FakeGraph, torch.Tensor]:
        output = run()
        captured.append(FakeGraph(run, output))
        return captured[-1], output
    return capture
