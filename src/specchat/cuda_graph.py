"""Work captured as a CUDA graph and replayed as one launch: the draft's captured steps
(decoding/static_step.py), and the probes that choose a kernel for them (quant/widths.py), which
must time a kernel as a replay runs it (its device time, without the host's launch: Triton's costs
tens of microseconds, as long as a product of a few rows)."""

from collections.abc import Callable

import torch

WARMUP = 2  # eager runs on a side stream before a capture, as CUDA graphs require


Pool = tuple[int, int]  # torch.cuda.graph_pool_handle()'s token


def capture_graph(run: Callable[[], torch.Tensor], pool: Pool | None = None
                  ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`run` captured as a CUDA graph after WARMUP eager runs on a side stream (its writes are the
    same each time: the warm-ups only repeat them), and the tensor it returns, which every replay
    writes anew. Graphs captured into one `pool` share their temporaries' memory: safe where they
    never run at once and no graph reads what another left in its temporaries."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = run()
    return graph, output


def replayed(run: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], object]:
    """On CUDA, a replay of `run` captured once; elsewhere `run` itself (nothing to capture)."""
    if device.type != "cuda":
        return run
    graph, _ = capture_graph(run)
    return graph.replay
