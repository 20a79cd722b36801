"""What the offload tiers' links deliver on this machine: pinned host -> device copies (the ram
tier on CUDA) and uncached reads of a fresh file (the disk tier)."""

import os
import tempfile
from pathlib import Path
from time import perf_counter

import torch

from specchat.cuda_device import cuda_usable
from specchat.errors import SpecchatError
from specchat.offload.direct_io import MiB, DirectReader, aligned_empty, measure_read_gbps, write_blob
from specchat.transfer import gb

PROBE_BLOCK = 64 * MiB
H2D_BYTES = 256 * MiB
H2D_REPEATS = 5


def measure_h2d_gbps() -> float | None:
    """Pinned host -> cuda:0 copy bandwidth in GB/s (1e9), or None without a GPU specchat runs on."""
    if not cuda_usable():
        return None
    host = aligned_empty(H2D_BYTES, pin=True)
    device = torch.empty(H2D_BYTES, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)  # warm-up: the first copy also sets up the context
    torch.cuda.synchronize()
    start = perf_counter()
    for _ in range(H2D_REPEATS):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return H2D_BYTES * H2D_REPEATS / (perf_counter() - start) / 1e9


def probe_disk(directory: Path, nbytes: int) -> tuple[float, bool]:
    """Uncached read GB/s of a fresh `nbytes` file in `directory`, and whether O_DIRECT was honoured."""
    try:
        fd, name = tempfile.mkstemp(prefix="doctor-probe-", suffix=".bin", dir=directory)
    except OSError as error:
        raise SpecchatError(f"cannot write in the offload directory {directory}: {error.strerror}") from error
    path = Path(name)
    try:
        try:
            write_probe(fd, nbytes)
        except OSError as error:
            raise SpecchatError(f"cannot write the {gb(nbytes)} probe file in {directory}: {error.strerror}") from error
        finally:
            os.close(fd)
        with DirectReader(path) as reader:
            direct = reader.direct
        return measure_read_gbps(path), direct
    finally:
        path.unlink()


def write_probe(fd: int, nbytes: int) -> None:
    """`nbytes` of random data (a disk or a virtual disk may skip zeros), fsynced so evict works."""
    block = torch.randint(0, 256, (min(PROBE_BLOCK, nbytes),), dtype=torch.uint8, generator=torch.Generator())
    for offset in range(0, nbytes, block.numel()):
        write_blob(fd, block[: nbytes - offset], offset)
    os.fsync(fd)
