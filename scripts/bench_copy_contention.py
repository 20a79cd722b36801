"""Does a draft step slow down while the streamer's loader moves layers over the link? On one H200
(2026-12-04) the paper's pair at budget 1024 drafted at 9.0 ms a step with 15 resident target
layers and a ring of 2 slots (the link idle while the draft runs), and at 11.5 ms with none
resident and a ring of 17 (the link loading the next pass's layers meanwhile). This times a
stand-in for the draft's step, a Llama-3.1-8B-shaped stack of linears at a tree step's rows
(captured in a CUDA graph on CUDA, its top children read back as the drafter reads them), alone and
while a thread moves layer-sized host buffers (pinned on CUDA) into two device slots through the
streamer's own mover (offload/cuda.py), issuing and settling each as the loader does. Between two
steps the host runs `--host-ops` small device ops, as the drafter's books do between its replays
(~40 on the H200's trace), and moves the step's input rows over from a pinned staging without
waiting, as the drafter moves its lineages, ids and the rows of an embedding held on the host
(`--no-inputs` leaves them out). Copied, they queue on the one host->device copy engine behind a
load, ~8 ms at 55 GB/s (host_pull.py names who measured that elsewhere). On CUDA more rows: each
load split into 32 MB pieces, all queued at once (torchrec's study found the engine runs a
stream's ready copies as one block, so these should not help), then one at a time; and the
inputs pulled by the device's threads (host_pull.py, as the drafter now moves them), alone and
beside the loads. A step's host ms is the drafter's wall time, its device ms the replay's own
(CUDA events; the CPU has none).

    python scripts/bench_copy_contention.py              # 32 layers, 128 rows, 40 steps, 0.47 GB loads
    python scripts/bench_copy_contention.py --dry-run    # shrunk widths, on any device
"""

import argparse
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Self

import torch

from specchat.cuda_graph import replayed
from specchat.host_pull import ReadFence, pull
from specchat.offload.cuda import CudaMover
from specchat.offload.transport import HostMover, Mover

CHILDREN = 16  # the top children a step reads back for each row


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    qkv: int  # the stacked q, k and v projections' width
    mlp: int
    vocab: int
    load_bytes: int  # one streamed target layer


FULL = Shape(layers=32, hidden=4096, qkv=6144, mlp=14336, vocab=128256, load_bytes=450 * 2**20)
SHRUNK = Shape(layers=2, hidden=64, qkv=96, mlp=128, vocab=256, load_bytes=2**20)
PIECE = 32 * 2**20  # a load's piece, where the loader splits its loads (on CUDA)


@dataclass
class Layer:
    qkv: torch.Tensor
    out: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128, help="a tree step's rows (a budget of 1024 expands 128)")
    parser.add_argument("--steps", type=int, default=40, help="steps timed in each mode, after 3 unmeasured")
    parser.add_argument("--host-ops", type=int, default=40, help="small device ops the host runs between two steps")
    parser.add_argument("--no-inputs", action="store_true", help="no input rows copied over before each step")
    parser.add_argument("--dry-run", action="store_true", help="shrunk widths and loads, on any device")
    options = parser.parse_args(argv)
    if options.rows < 1 or options.steps < 1 or options.host_ops < 0:
        parser.error("--rows and --steps are at least 1, --host-ops at least 0")
    return options


def stack(shape: Shape, device: torch.device, dtype: torch.dtype) -> tuple[list[Layer], torch.Tensor]:
    """Random weights of the stand-in's layers and LM head, scaled to keep activations finite."""
    def weight(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device=device, dtype=dtype) / rows ** 0.5

    layers = [Layer(weight(shape.hidden, shape.qkv), weight(shape.hidden, shape.hidden),
                    weight(shape.hidden, 2 * shape.mlp), weight(shape.mlp, shape.hidden)) for _ in range(shape.layers)]
    return layers, weight(shape.hidden, shape.vocab)


def step_of(layers: list[Layer], head: torch.Tensor, rows: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The stand-in's step over the static `rows`: each layer's four products, then the head's top
    children (indices, as the drafter reads back)."""
    def step() -> torch.Tensor:
        x = rows
        for layer in layers:
            x = x + (x @ layer.qkv)[:, :x.shape[1]] @ layer.out
            gate, up = (x @ layer.gate_up).chunk(2, dim=1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer.down
        return torch.topk(x @ head, CHILDREN, dim=1).indices
    return step


class Loader:
    """A thread moving one host buffer into two device slots in turn, as the streamer's loader does:
    wait for the slot to be free, issue the copy, settle it; bytes and seconds counted."""

    def __init__(self, mover: Mover, host: torch.Tensor, piece: int = 0, queued: bool = True) -> None:
        """`piece`: the bytes of each copy a load is split into (0: one copy); `queued`: the pieces
        all issued before the load settles, else each settled before the next is issued."""
        self.mover, self.host = mover, host
        self.pieces = [(start, host[start: start + piece]) for start in range(0, host.numel(), piece)] if piece \
            else [(0, host)]
        self.queued = queued
        self.stopping = threading.Event()
        self.moved = 0
        self.seconds = 0.0
        self.thread = threading.Thread(target=self.run, name="bench-loader", daemon=True)

    def run(self) -> None:
        start, slot = perf_counter(), 0
        while not self.stopping.is_set():
            self.mover.wait_free(slot)
            for offset, piece in self.pieces:
                self.mover.issue(slot, piece, offset)
                if not self.queued:
                    self.mover.settle(slot)
            if self.queued:
                self.mover.settle(slot)
            self.moved += self.host.numel()
            slot = 1 - slot
        self.seconds = perf_counter() - start

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()


def books_of(host_ops: int, device: torch.device, rows: torch.Tensor | None, pulled: bool) -> Callable[[], None]:
    """The host's work between two steps: `host_ops` small device ops (the drafter's masks, ids and
    slots written into static buffers), then, given the step's input `rows`, new rows staged on the
    host (pinned beside a GPU) and moved into them without waiting: by a copy (the copy engine's),
    or `pulled` by the device's threads as the drafter moves them (host_pull.py)."""
    buffer = torch.zeros(128, 64, device=device)
    staged = None if rows is None else torch.empty(rows.shape, dtype=rows.dtype, pin_memory=rows.is_cuda)
    read = ReadFence()  # as the drafter's stagings: written again once the last step's rows were read

    def books() -> None:
        for index in range(host_ops):
            buffer[index % 128].fill_(index)
        if rows is not None:
            read.wait()
            staged.normal_()
            if pulled:
                pull(rows, staged)
            else:
                rows.copy_(staged, non_blocking=True)
            read.pass_(device)
    return books


def timed_steps(run: Callable[[], object], books: Callable[[], None], out: torch.Tensor, steps: int,
                device: torch.device) -> tuple[list[float], list[float]]:
    """Host ms of each step (the books, the step, then its children read back) and, on CUDA, its
    device ms."""
    cuda = device.type == "cuda"
    # made before the timed steps, so that no step's host time holds their creation
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(steps + 3)] if cuda else []
    host, on_device = [], []
    for index in range(steps + 3):
        start = perf_counter()
        books()
        if cuda:
            marks[index][0].record()
        run()
        if cuda:
            marks[index][1].record()
        out.cpu()  # the drafter reads each step's children before it picks the next rows
        if index >= 3:
            host.append((perf_counter() - start) * 1000)
            if cuda:
                on_device.append(marks[index][0].elapsed_time(marks[index][1]))
    return host, on_device


def movers(shape: Shape, device: torch.device) -> tuple[Mover, torch.Tensor]:
    """The streamer's mover over two slots and a load's host buffer."""
    pinned = device.type == "cuda"
    host = torch.empty(shape.load_bytes, dtype=torch.uint8, pin_memory=pinned)
    slots = [torch.empty(shape.load_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
    return (CudaMover(slots) if pinned else HostMover(slots)), host


@dataclass(frozen=True)
class Load:
    """How a mode loads beside the steps: `piece` bytes a copy (0: a load in one copy; None: no
    loads), the pieces `queued` at once or one at a time, the step's inputs `pulled` by the
    device's threads or copied."""

    piece: int | None
    queued: bool = True
    pulled: bool = False


def modes(cuda: bool, inputs: bool) -> list[tuple[str, Load]]:
    """The rows timed: alone and beside the loader's copies; on CUDA, the loads also in pieces and,
    with input rows, the rows pulled (on a CPU a pull is the same copy)."""
    chosen = [("alone", Load(None)), ("beside the loader's copies", Load(0))]
    if cuda:
        chosen += [("the same, in 32 MB pieces queued at once", Load(PIECE)),
                   ("the same, in 32 MB pieces one at a time", Load(PIECE, queued=False))]
    if cuda and inputs:
        chosen += [("alone, the inputs pulled by the device's threads", Load(None, pulled=True)),
                   ("beside the loader's copies, the inputs pulled", Load(0, pulled=True))]
    return chosen


def row(mode: str, host: list[float], on_device: list[float], loader: Loader | None) -> str:
    device_ms = f"{statistics.median(on_device):.2f}" if on_device else "n/a"
    rate = f"{loader.moved / loader.seconds / 1e9:.1f}" if loader is not None and loader.seconds else "none"
    p90 = statistics.quantiles(host, n=10)[-1] if len(host) > 1 else host[0]
    return f"| {mode} | {statistics.median(host):.2f} | {p90:.2f} | {device_ms} | {rate} |"


def main(argv: list[str] | None = None) -> None:
    options = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not options.dry_run else "cpu")
    shape = SHRUNK if options.dry_run else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layers, head = stack(shape, device, dtype)
    rows = torch.randn(options.rows, shape.hidden, device=device, dtype=dtype)
    step = step_of(layers, head, rows)
    out = step()
    run = replayed(lambda: out.copy_(step()), device)
    inputs = "no input rows copied" if options.no_inputs else f"{rows.numel() * rows.element_size() / 1e6:.2f} MB of " \
        "input rows copied"
    print(f"a {shape.layers}-layer draft stand-in at {options.rows} rows on {device}, {options.host_ops} host ops "
          f"and {inputs} between steps, {shape.load_bytes / 1e9:.3f} GB a load")
    print("| mode | host ms a step (median) | p90 | device ms (median) | loads GB/s |")
    print("|---|---|---|---|---|")
    for mode, load in modes(device.type == "cuda", not options.no_inputs):
        books = books_of(options.host_ops, device, None if options.no_inputs else rows, load.pulled)
        if load.piece is None:
            print(row(mode, *timed_steps(run, books, out, options.steps, device), None))
            continue
        with Loader(*movers(shape, device), load.piece, load.queued) as loader:
            host, on_device = timed_steps(run, books, out, options.steps, device)
        print(row(mode, host, on_device, loader))


if __name__ == "__main__":
    main()
