"""Work captured as a CUDA graph and replayed as one launch: the draft's captured steps
(decoding/static_step.py), and the probes that choose a kernel for them (quant/widths.py), which
must time a kernel as a replay runs it (its device time, without the host's launch: Triton's costs
tens of microseconds, as long as a product of a few rows). A capture's warm-ups and the capture
run where shapes repeat (`repeating_shapes`), as a static draft step does, captured or not: there
a kernel that plans once a shape on the host may run, elsewhere it would plan every call."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from specchat.capture_gate import GATE

WARMUP = 2  # eager runs on a side stream before a capture, as CUDA graphs require


Pool = tuple[int, int]  # torch.cuda.graph_pool_handle()'s token
# whether the running code runs at shapes that repeat: a capture's warm-ups and the capture, whose
# every replay repeats them, and a static draft step's (decoding/static_step.py), captured or not
REPEATING: ContextVar[bool] = ContextVar("repeating_shapes", default=False)


def shapes_repeat() -> bool:
    """Whether the caller runs inside `repeating_shapes`."""
    return REPEATING.get()


@contextmanager
def repeating_shapes() -> Iterator[None]:
    """The scope of work whose shapes repeat: a kernel that plans per shape once, on the host
    (cuDNN's attention: bounded_attention.backends_for), pays there and nowhere else."""
    token = REPEATING.set(True)
    try:
        yield
    finally:
        REPEATING.reset(token)


def capture_graph(run: Callable[[], torch.Tensor], pool: Pool | None = None
                  ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`run` captured as a CUDA graph after WARMUP eager runs on a side stream (its writes are the
    same each time: the warm-ups only repeat them), and the tensor it returns, which every replay
    writes anew. Graphs captured into one `pool` share their temporaries' memory: safe where they
    never run at once and no graph reads what another left in its temporaries. The capture waits
    for other threads' device jobs (capture_gate.py)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with repeating_shapes():
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with GATE.capture(), torch.cuda.graph(graph, pool=pool):  # no other thread's job runs meanwhile
            output = run()
    return graph, output


def replayed(run: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], object]:
    """On CUDA, a replay of `run` captured once; elsewhere `run` itself (nothing to capture)."""
    if device.type != "cuda":
        return run
    graph, _ = capture_graph(run)
    return graph.replay
