"""`--budget auto`'s measured costs, probed once per machine, model pair and tier and kept in the
user cache; anything that changes the costs (another CPU, torch, thread count, dtype, draft
approximation, offload tier) changes the key and so triggers a new probe. As a kept choice is
(machine_choices.py), costs are kept with the load they were probed under and probed again at a
quiet startup when that load was high: a one-token pass probed beside a build read 0.58 s, ten
times a quiet one, and sized every tree on that machine from then on."""

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from specchat.decoding.autosize import Costs
from specchat import machine_choices
from specchat.machine_choices import BUSY, keyed_path, machine_facts, write_atomically

# Bumped whenever what a probe measures changes, so older files are not read as today's: 2 times
# an offloaded pass's compute apart from its streaming (which version 1 counted in); 3 times an int8
# draft on fbgemm's dynamic kernel (version 2's ran weight-only int8); 4 times a MoE target's
# waits for the experts it fetches, by pass size, apart from the heads its ring stages; 5 the link's
# seconds for the wide passes whose ring loads move whole layers; 6 the load the costs were probed under;
# 7 a target pass's head over the rows the walk's first call computes (decoding/head_rows.py), not 8.
PROBE_FORMAT = 7


def probe_path(device: torch.device, models: dict) -> Path:
    """The cache file for `models` (what was loaded and how) on this machine."""
    return keyed_path("", {"machine": machine_facts(device), "models": models, "format": PROBE_FORMAT})


def probed_costs(path: Path, probe: Callable[[], Costs]) -> Costs:
    """The costs kept at `path`, else `probe()`d now and kept; costs probed under load are probed
    again at a quiet startup, and the less loaded of the two probes kept."""
    kept = read_costs(path)
    if kept is not None and not (kept[1] >= BUSY and machine_choices.quiet_startup()):
        return kept[0]
    costs, load = machine_choices.load_during(probe)  # through the module: a test stands in for the readings
    if kept is not None and load >= kept[1]:
        return kept[0]
    write_costs(path, costs, load)
    return costs


def read_costs(path: Path) -> tuple[Costs, float] | None:
    """The costs kept at `path` and the load they were probed under."""
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    fields = kept["costs"]
    costs = Costs(**{name: tuple(value) if isinstance(value, list) else value for name, value in fields.items()})
    return costs, kept["load"]


def write_costs(path: Path, costs: Costs, load: float) -> None:
    write_atomically(path, json.dumps({"costs": asdict(costs), "load": load}))
