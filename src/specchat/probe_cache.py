"""`--budget auto`'s measured costs, probed once per machine, model pair and tier and kept in the
user cache; anything that changes the costs (another CPU, torch, thread count, dtype, draft
approximation, offload tier) changes the key and so triggers a new probe."""

import json
import hashlib
import os
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from specchat.decoding.autosize import Costs
from specchat.paths import probe_dir

# Bumped whenever what a probe measures changes, so older files are not read as today's: 2 times
# an offloaded pass's compute apart from its streaming (which version 1 counted in); 3 times an int8
# draft on fbgemm's dynamic kernel (version 2's ran weight-only int8); 4 times a MoE target's
# waits for the experts it fetches, by pass size, apart from the heads its ring stages; 5 the link's
# seconds for the wide passes whose ring loads move whole layers.
PROBE_FORMAT = 5


def machine_facts(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__}


def probe_path(device: torch.device, models: dict) -> Path:
    """The cache file for `models` (what was loaded and how) on this machine."""
    key = json.dumps({"machine": machine_facts(device), "models": models, "format": PROBE_FORMAT}, sort_keys=True)
    return probe_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def read_costs(path: Path) -> Costs | None:
    if not path.exists():
        return None
    fields = json.loads(path.read_text())
    return Costs(**{name: tuple(value) if isinstance(value, list) else value for name, value in fields.items()})


def write_costs(path: Path, costs: Costs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(asdict(costs)))
    partial.replace(path)  # atomic: a concurrent reader sees no half-written file
