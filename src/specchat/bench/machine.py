"""One line describing the machine a benchmark ran on, for the records in docs/benchmarks.md."""

import os
import platform

import torch

from specchat.cuda_device import cuda_usable


def describe_machine() -> str:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    accelerator = torch.cuda.get_device_name() if cuda_usable() else "no GPU"  # an older one runs nothing
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {memory_gib:.0f} GiB, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {accelerator}"
    )
