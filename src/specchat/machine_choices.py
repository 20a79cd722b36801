"""Startup measurements that decide how models are stored, measured once per machine and kept.

A CPU-dependent choice is measured, never fixed. Measured at every startup, though, a choice
between two products that run close flips from run to run: up to how many rows the draft's int8
linears beat dense ones read 32 in four of six startups on the AMX Xeon and "every width" in the
other two. Each flip changed the memory plan (the draft's dense weights kept beside its int8
ones: 1.24 GB, or not: 0.53 GB) and the key of `--budget auto`'s cached costs, which were then
probed again (~26 s at startup). Kept in the probe directory under this machine's facts, a choice
is what it was at the last startup, as the cost probe is; removing the directory measures again.
"""

import hashlib
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from specchat.paths import probe_dir

Choice = int | float | bool | str | None  # what a JSON file holds as it was written


def machine_facts(device: torch.device) -> dict:
    """What makes one machine's measurements another's: the CPU, its cores and the threads torch
    runs, the GPU, the torch build."""
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__}


def keyed_path(stem: str, key: dict) -> Path:
    """A file of the probe directory named by `stem` and a hash of `key`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return probe_dir() / f"{stem}{digest}.json"


def write_atomically(path: Path, text: str) -> None:
    """A concurrent reader (another process starting on the same machine) sees no half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    partial.replace(path)


def remembered(name: str, device: torch.device, measure: Callable[[], Choice]) -> Choice:
    """The choice `name` on this machine: as kept from an earlier startup, else `measure()`d now
    and kept. A file that does not parse is measured over."""
    path = keyed_path("choice-", {"machine": machine_facts(device), "choice": name})
    try:
        return json.loads(path.read_text())["value"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        value = measure()
        write_atomically(path, json.dumps({"choice": name, "value": value}))
        return value
