"""`specchat doctor`: what this machine offers for running a large target, and how to run it.

Small functions gather the facts into `Facts`; the pure `recommend` turns the few that matter
into an offload tier and a draft tree budget; `render` formats both for the terminal.
"""

import math
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import psutil
import torch
from safetensors import safe_open

from specchat.errors import SpecchatError
from specchat.models.embedded import EMBEDDED, converted_path
from specchat.models.marker import is_converted
from specchat.models.registry import DEFAULT_TARGET
from specchat.offload.direct_io import MiB, DirectReader, align_up, aligned_empty, measure_read_gbps, write_blob
from specchat.paths import cache_dir

HEADROOM = 1.2  # weights "fit" when 1.2x their size is free: activations, KV cache, draft, the OS
BYTES_PER_PARAM = 2  # bfloat16, the default dtype
# The default target (Qwen2.5-Coder-1.5B-Instruct) as converted, with its LM head untied:
# used until the converted directory exists, so that doctor never assembles or converts.
DEFAULT_TARGET_PARAMS = 1_777_088_000
PROBE_BLOCK = 64 * MiB
H2D_BYTES = 256 * MiB
H2D_REPEATS = 5


@dataclass(frozen=True)
class CudaDevice:
    name: str
    total: int
    free: int


@dataclass(frozen=True)
class Facts:
    cpu: str
    cores: int  # physical
    threads: int  # logical
    torch_version: str
    cuda: tuple[CudaDevice, ...]
    ram_total: int
    ram_available: int
    offload_dir: Path
    disk_free: int
    h2d_gbps: float | None  # None without CUDA
    disk_gbps: float
    direct: bool  # O_DIRECT honoured; False: buffered reads dropped from the cache by fadvise
    probe_bytes: int
    target: str
    target_bytes: int


@dataclass(frozen=True)
class Recommendation:
    tier: str  # none | ram | disk
    budget: int  # draft tree size K
    reason: str


def default_offload_dir() -> Path:
    return cache_dir() / "offload"


def gather(offload_dir: Path, probe_gb: float) -> Facts:
    """Everything doctor reports; writes, reads and deletes a probe file of `probe_gb` GB."""
    if not (probe_gb > 0 and math.isfinite(probe_gb)):
        raise SpecchatError(f"--probe-gb must be a positive number of GB (got {probe_gb})")
    directory = offload_dir.expanduser()
    prepare_dir(directory)
    probe_bytes = align_up(int(probe_gb * 1e9))
    disk_free = shutil.disk_usage(directory).free
    if probe_bytes > disk_free:
        raise SpecchatError(f"--probe-gb {probe_gb} needs {gb(probe_bytes)} but {directory} has {gb(disk_free)} free")
    memory = psutil.virtual_memory()  # before the probe file passes through the page cache
    disk_gbps, direct = probe_disk(directory, probe_bytes)
    threads = psutil.cpu_count(logical=True) or 1
    return Facts(
        cpu=cpu_model(),
        cores=psutil.cpu_count(logical=False) or threads,
        threads=threads,
        torch_version=torch.__version__,
        cuda=cuda_devices(),
        ram_total=memory.total,
        ram_available=memory.available,
        offload_dir=directory,
        disk_free=disk_free,
        h2d_gbps=measure_h2d_gbps(),
        disk_gbps=disk_gbps,
        direct=direct,
        probe_bytes=probe_bytes,
        target=DEFAULT_TARGET,
        target_bytes=default_target_bytes(),
    )


def prepare_dir(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise SpecchatError(f"--offload-dir {directory} is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecchatError(f"cannot create the offload directory {directory}: {error.strerror}") from error


def cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo (Linux x86), else what the platform reports."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cuda_devices() -> tuple[CudaDevice, ...]:
    if not torch.cuda.is_available():
        return ()
    devices = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        devices.append(CudaDevice(torch.cuda.get_device_name(index), total, free))
    return tuple(devices)


def measure_h2d_gbps() -> float | None:
    """Pinned host -> cuda:0 copy bandwidth in GB/s (1e9), or None without CUDA."""
    if not torch.cuda.is_available():
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


def default_target_bytes() -> int:
    """Bytes of the default target's weights in bfloat16, counted from the converted safetensors
    headers when they exist (nothing is loaded)."""
    directory = converted_path(EMBEDDED[DEFAULT_TARGET])
    params = count_params(directory) if is_converted(directory) else DEFAULT_TARGET_PARAMS
    return params * BYTES_PER_PARAM


def count_params(directory: Path) -> int:
    total = 0
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, framework="pt") as tensors:
            total += sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return total


def advise(facts: Facts) -> Recommendation:
    device_free = facts.cuda[0].free if facts.cuda else None  # the engines compute on cuda:0
    return recommend(facts.target_bytes, device_free, facts.ram_available, facts.disk_gbps, facts.h2d_gbps)


def recommend(
    target_bytes: int, device_free: int | None, ram_available: int, disk_gbps: float, h2d_gbps: float | None
) -> Recommendation:
    """Where the target's weights should live and how large a draft tree pays.

    `device_free` is the CUDA device's free memory, None on a CPU (whose memory is the RAM).
    In memory, a CPU's draft costs ~0.4x the target per step, so small trees pay (16), while a
    GPU scores hundreds of tokens for the price of a few (256). Offloaded, a target pass costs
    the time to stream every weight, nearly flat in tree size, so large trees pay: 256 on a CPU
    (which still computes the tree), 1024 on a GPU.
    """
    cuda = device_free is not None
    need = target_bytes * HEADROOM
    size = gb(target_bytes)
    if need <= (device_free if cuda else ram_available):
        room = f"GPU memory ({gb(device_free)} free)" if cuda else f"RAM ({gb(ram_available)} available)"
        why = "a GPU scores hundreds of tokens for the price of a few" if cuda else "on a CPU small trees pay"
        reason = f"the weights ({size}) fit in {room} with 20% headroom; {why}"
        return Recommendation("none", 256 if cuda else 16, reason)
    if cuda and need <= ram_available:
        tier, source, gbps = "ram", "pinned RAM", h2d_gbps
        missing = f"do not fit in GPU memory ({gb(device_free)} free) but fit in RAM ({gb(ram_available)} available)"
    else:
        tier, source, gbps = "disk", "disk", disk_gbps
        missing = f"do not fit in RAM ({gb(ram_available)} available) with 20% headroom"
    return Recommendation(
        tier,
        1024 if cuda else 256,
        f"the weights ({size}) {missing}; {stream_cost(target_bytes, source, gbps)}, "
        "nearly flat in tree size, so a large tree pays",
    )


def stream_cost(target_bytes: int, source: str, gbps: float | None) -> str:
    if gbps is None:
        return f"each target pass streams them from {source}"
    return f"each target pass streams them from {source} at {gbps:.2f} GB/s, ~{target_bytes / (gbps * 1e9):.1f} s"


def render(facts: Facts, rec: Recommendation) -> str:
    h2d = "no CUDA: skipped" if facts.h2d_gbps is None else f"{facts.h2d_gbps:.2f} GB/s (pinned memory)"
    mode = "O_DIRECT" if facts.direct else "O_DIRECT refused by the filesystem: buffered + fadvise DONTNEED"
    lines = [
        "devices",
        f"  cpu            {facts.cpu} ({facts.cores} cores, {facts.threads} threads)",
        f"  torch          {facts.torch_version}",
        *cuda_lines(facts.cuda),
        "memory",
        f"  ram            {gb(facts.ram_total)} total, {gb(facts.ram_available)} available",
        f"  disk           {gb(facts.disk_free)} free at {facts.offload_dir}",
        "bandwidth",
        f"  host->device   {h2d}",
        f"  disk read      {facts.disk_gbps:.2f} GB/s ({mode}; {gb(facts.probe_bytes)} probe)",
        "recommendation",
        f"  target         {facts.target}: {gb(facts.target_bytes)} in bfloat16",
        f"  offload        {rec.tier}",
        f"  budget         {rec.budget}",
        f"  why            {rec.reason}",
    ]
    return "\n".join(lines)


def cuda_lines(devices: tuple[CudaDevice, ...]) -> list[str]:
    if not devices:
        return ["  cuda           no CUDA device"]
    return [f"  cuda:{i:<9} {d.name}: {gb(d.total)} total, {gb(d.free)} free" for i, d in enumerate(devices)]


def gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB"
