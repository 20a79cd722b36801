"""The facts `specchat doctor` reports: devices, memory, free disk and the offload links' bandwidths."""

import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from specchat.cuda_device import cuda_usable, unused_gpu
from specchat.errors import SpecchatError
from specchat.machine_choices import cpu_identity
from specchat.offload.direct_io import align_up
from specchat.offload.probe import measure_h2d_gbps, probe_disk
from specchat.paths import expanded, make_output_dir
from specchat.transfer import gb

PROBE_GB_MIN, PROBE_GB_MAX = 0.001, 1e6  # 1 MB (a few bytes rounded to no aligned bytes); past any disk


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
    cuda: tuple[CudaDevice, ...]  # the GPUs specchat runs on
    unused_gpu: str | None  # why a GPU torch sees is left unused (cuda_device.py)
    ram_total: int
    ram_available: int
    offload_dir: Path
    disk_free: int
    h2d_gbps: float | None  # None without CUDA
    disk_gbps: float
    direct: bool  # O_DIRECT honoured; False: buffered reads dropped from the cache by fadvise
    probe_bytes: int


def probe_room(offload_dir: Path, probe_gb: float) -> tuple[Path, int]:
    """The directory the probe file goes in (made) and its bytes; one line where either cannot be,
    before anything is measured."""
    if not PROBE_GB_MIN <= probe_gb <= PROBE_GB_MAX:
        raise SpecchatError(f"--probe-gb must be between {PROBE_GB_MIN:g} and {PROBE_GB_MAX:g} GB (got {probe_gb})")
    directory = expanded(offload_dir, "--offload-dir")
    make_output_dir("--offload-dir", directory)
    probe_bytes = align_up(int(probe_gb * 1e9))
    disk_free = shutil.disk_usage(directory).free
    if probe_bytes > disk_free:
        raise SpecchatError(f"--probe-gb {probe_gb} needs {gb(probe_bytes)} but {directory} has {gb(disk_free)} free")
    return directory, probe_bytes


def gather(directory: Path, probe_bytes: int) -> Facts:
    """Everything doctor reports; writes, reads and deletes a probe file of `probe_bytes` in
    `directory` (`probe_room`'s)."""
    disk_free = shutil.disk_usage(directory).free  # before the probe file takes its share
    memory = psutil.virtual_memory()  # before the probe file passes through the page cache
    disk_gbps, direct = probe_disk(directory, probe_bytes)
    threads = psutil.cpu_count(logical=True) or 1
    return Facts(
        cpu=cpu_identity()[0],
        cores=psutil.cpu_count(logical=False) or threads,
        threads=threads,
        torch_version=torch.__version__,
        cuda=cuda_devices(),
        unused_gpu=unused_gpu(),
        ram_total=memory.total,
        ram_available=memory.available,
        offload_dir=directory,
        disk_free=disk_free,
        h2d_gbps=measure_h2d_gbps(),
        disk_gbps=disk_gbps,
        direct=direct,
        probe_bytes=probe_bytes,
    )


def cuda_devices() -> tuple[CudaDevice, ...]:
    if not cuda_usable():
        return ()
    devices = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        devices.append(CudaDevice(torch.cuda.get_device_name(index), total, free))
    return tuple(devices)
