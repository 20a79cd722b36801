"""`--budget auto`'s measured costs, probed once per machine, model pair and tier and kept in the
user cache; anything that changes the costs (another CPU, torch, thread count, dtype, draft
approximation, offload tier) changes the key and so triggers a new probe."""

import json
from dataclasses import asdict
from pathlib import Path

import torch

from specchat.decoding.autosize import Costs
from specchat.machine_choices import keyed_path, machine_facts, write_atomically

# Bumped whenever what a probe measures changes, so older files are not read as today's: 2 times
# an offloaded pass's compute apart from its streaming (which version 1 counted in); 3 times an int8
# draft on fbgemm's dynamic kernel (version 2's ran weight-only int8); 4 times a MoE target's
# waits for the experts it fetches, by pass size, apart from the heads its ring stages; 5 the link's
# seconds for the wide passes whose ring loads move whole layers.
PROBE_FORMAT = 5


def probe_path(device: torch.device, models: dict) -> Path:
    """The cache file for `models` (what was loaded and how) on this machine."""
    return keyed_path("", {"machine": machine_facts(device), "models": models, "format": PROBE_FORMAT})


def read_costs(path: Path) -> Costs | None:
    if not path.exists():
        return None
    fields = json.loads(path.read_text())
    return Costs(**{name: tuple(value) if isinstance(value, list) else value for name, value in fields.items()})


def write_costs(path: Path, costs: Costs) -> None:
    write_atomically(path, json.dumps(asdict(costs)))
