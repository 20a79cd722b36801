"""Host bytes moved onto a GPU by the GPU's own threads, which read pinned memory over the link, in
place of its copy engine.

A GPU copies host -> device on one engine, in the order the copies were queued, whatever their
streams or priorities: a 51 KB copy waited 12 ms behind a 200 MB one (NVIDIA/cudf#15620), and
torchrec's copy-engine study (2026) found the engine first-in first-out and blind to priority.
While the draft builds a tree, the layer streamer keeps that engine busy with the next pass's
layers, 0.47 GB each (~9 ms at the H200's 52 GB/s), and before each step the drafter copied the
step's inputs over: the nodes' lineages, their ids and positions, the rows of an embedding held on
the host. A step that met a load waited for it. On one H200 the paper's pair drafted at 11.5 ms a
step with its ring loading beside the draft, at 9.0 with the link idle (2026-12-04); half the steps
meeting a load and waiting half of one on average would cost ~2.3 ms a step.

Pinned host memory lies in the GPU's address space (unified addressing: a pinned buffer's host
address is also its device address), so a kernel may load from it. One Triton program copies a
block of 4-byte words (bytes where the size is no multiple of 4) from the pinned buffer to the
device; its reads cross the link beside the copy engine's transfers instead of queueing behind
them (what that costs a step, alone and beside the loads, scripts/bench_copy_contention.py times).

Without CUDA (or Triton) `pull` is a plain copy: the CPU tests exercise the callers, and the kernel
itself runs under Triton's interpreter in its own tests.
"""

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch import Tensor

from specchat.triton_support import triton_installed

BLOCK = 1024  # words a program copies


@cache
def _kernel(interpret: bool) -> Any:
    """The copy, decorated under TRITON_INTERPRET as it is now (`interpret` only keys the cache:
    Triton reads the setting when `triton.jit` decorates)."""
    import triton
    import triton.language as tl

    # one compiled kernel a word size: Triton would otherwise compile it again for counts that are
    # multiples of 16 and for those that are not (a step's sizes vary), each time while a reply waits
    @triton.jit(do_not_specialize=["count"])
    def copy(source_ptr, out_ptr, count, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < count
        tl.store(out_ptr + offsets, tl.load(source_ptr + offsets, mask=inside), mask=inside)

    return copy


def words(tensor: Tensor) -> Tensor:
    """A contiguous tensor's bytes as 4-byte words, or as bytes where their count is no multiple of 4."""
    flat = tensor.view(-1).view(torch.uint8)  # a view: a non-contiguous tensor is refused, not copied
    return flat.view(torch.int32) if flat.numel() % 4 == 0 else flat


def launch(out: Tensor, host: Tensor) -> None:
    """Copy `host`'s bytes into `out` (contiguous, as many bytes) by the kernel: on CUDA from pinned
    memory, on the current stream, or on the CPU under Triton's interpreter."""
    import triton

    if out.numel() * out.element_size() != host.numel() * host.element_size():
        raise ValueError(f"{host.numel() * host.element_size()} bytes pulled into {out.numel() * out.element_size()}")
    source, target = words(host), words(out)
    if source.numel() == 0:
        return
    _kernel(bool(triton.knobs.runtime.interpret))[(triton.cdiv(source.numel(), BLOCK),)](
        source, target, source.numel(), BLOCK=BLOCK)


def pull(out: Tensor, host: Tensor) -> None:
    """Copy `host` (pinned, contiguous) into `out` on its device without waiting: by the kernel on
    CUDA where the two hold one dtype, so that no layer the copy engine is moving delays it, else by
    a plain copy (which converts a dtype). The caller writes `host` again only once the device has
    read it (an event recorded after this call)."""
    if out.is_cuda and out.dtype == host.dtype and triton_installed():
        launch(out, host)
    else:
        out.copy_(host, non_blocking=True)


@dataclass
class ReadFence:
    """When a pinned staging may be written again: once the device has read what was last pulled
    from it (`pass_` after the pulls, `wait` before writing). Off a GPU a copy is done when it
    returns, so there is nothing to wait for."""

    event: torch.cuda.Event | None = None  # recorded after the last pull, on the device's stream

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def pass_(self, device: torch.device) -> None:
        if device.type == "cuda":  # one event, recorded again each time: its last recording is waited on
            self.event = self.event or torch.cuda.Event()
            self.event.record()


@dataclass
class HostSender:
    """Sends host arrays to `device` through one pinned buffer, pulled by the kernel on CUDA (on
    another device the array is copied as it is). The buffer is written again only once the device
    has read what was sent through it last, and grows to the largest array sent."""

    device: torch.device
    buffer: Tensor | None = None  # uint8, pinned
    read: ReadFence = field(default_factory=ReadFence)

    def send(self, host: Tensor) -> Tensor:
        """`host` (contiguous) on the device, as a new tensor."""
        if self.device.type != "cuda":
            return host.to(self.device)
        size = host.numel() * host.element_size()
        self.read.wait()  # the last pull is done: the buffer may be written (or freed)
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        staged = self.buffer[:size].view(host.dtype).view(host.shape)
        staged.copy_(host)
        out = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        pull(out, staged)
        self.read.pass_(self.device)
        return out
