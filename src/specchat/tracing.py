"""`specchat generate --trace FILE`: a reply's host and device work recorded by torch.profiler as a
Chrome trace (open it in Perfetto, ui.perfetto.dev, or chrome://tracing; `scripts/trace_summary.py`
sums it up per iteration). Only iterations past the first few are recorded: the prompt's pass and
the first trees compile kernels, time widths and capture the draft's steps, and a trace of those
says nothing about the ones after. Each iteration is one profiler step, its draft, pass and
verification named ranges (`span`)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from specchat.errors import SpecchatError

SKIPPED_ITERATIONS = 3  # the prompt's pass and two trees warming up, as the pair check's means leave out
TRACED_ITERATIONS = 3
SPAN_PREFIX = "specchat."


def span(name: str) -> record_function:
    """A named range of an iteration (draft, pass, verify): in a trace, its host time, and the
    kernels and copies it launched. Outside a trace it costs a dispatcher call (~1 us)."""
    return record_function(SPAN_PREFIX + name)


def check_trace_path(path: Path) -> None:
    """--trace's file: one line before anything loads when it cannot be written."""
    if path.is_dir():
        raise SpecchatError(f"--trace {path} is a folder: give a file name (.json, or .json.gz to compress it)")
    if not path.parent.is_dir():
        raise SpecchatError(f"--trace {path}: its folder {path.parent} does not exist")
    if not path.name.endswith((".json", ".json.gz")):
        raise SpecchatError(f"--trace {path}: name a .json or .json.gz file (a Chrome trace)")


@contextmanager
def traced_reply(path: Path | None) -> Iterator[Callable[[], None]]:
    """Around a reply: yields `step`, to call once an iteration ends. With a path, iterations
    SKIPPED_ITERATIONS + 1 to + TRACED_ITERATIONS are written to it as a Chrome trace (the one
    before them runs under the profiler unrecorded: its start-up cost stays out), those of a
    reply that ends sooner as far as it went; a reply of SKIPPED_ITERATIONS or fewer writes none."""
    if path is None:
        yield lambda: None
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    written = schedule(wait=SKIPPED_ITERATIONS - 1, warmup=1, active=TRACED_ITERATIONS, repeat=1)
    with profile(activities=activities, schedule=written,
                 on_trace_ready=lambda done: done.export_chrome_trace(str(path))) as profiler:
        yield profiler.step
