"""The most-routed experts of streamed MoE layers kept on the compute device, in the room the plan
left: a call finds an expert there and copies it into its ring slot on the device (HBM, or RAM on a
CPU) instead of fetching it over the link (PCIe, or the disk).

Which experts stay is decided by how often they were routed to: every call counts the experts its
tokens picked, and an expert fetched over the link takes a free place, or the place of the cached
expert routed to least (when that one was routed to less). The counts are kept beside the layer
file (`counts_path`), so a later run starts with the experts this model's users route to most
already in place, read once at startup.
"""

import json
from collections import Counter
from pathlib import Path

import torch

Key = tuple[int, int]  # (layer, expert)


class ExpertCache:
    """`places` places of `unit_bytes` each on `device`; counts of routed experts by (layer, expert)."""

    def __init__(self, places: int, unit_bytes: int, device: torch.device, counts: Counter | None = None) -> None:
        self.unit_bytes = unit_bytes
        self.buffer = torch.empty(places * unit_bytes, dtype=torch.uint8, device=device)
        self.free = list(range(places))[::-1]
        self.places: dict[Key, int] = {}
        self.counts: Counter = counts if counts is not None else Counter()

    @property
    def capacity(self) -> int:
        return len(self.free) + len(self.places)

    def count(self, layer: int, experts: list[int]) -> None:
        """One call of `layer` routed to `experts`."""
        self.counts.update((layer, expert) for expert in experts)

    def find(self, layer: int, expert: int) -> torch.Tensor | None:
        """The cached unit of `expert` of `layer` (its first bytes), or None."""
        place = self.places.get((layer, expert))
        return None if place is None else self.view(place)

    def offer(self, layer: int, expert: int, unit: torch.Tensor) -> None:
        """Keep a copy of `unit` (an expert just fetched over the link) if there is a free place, or
        if the least routed expert cached was routed to less often."""
        key = (layer, expert)
        if key in self.places or not self.capacity:
            return
        if not self.free:
            victim = min(self.places, key=self.counts.__getitem__)
            if self.counts[victim] >= self.counts[key]:
                return
            self.free.append(self.places.pop(victim))
        place = self.free.pop()
        self.view(place)[: unit.numel()].copy_(unit)
        self.places[key] = place

    def view(self, place: int) -> torch.Tensor:
        return self.buffer[place * self.unit_bytes:(place + 1) * self.unit_bytes]

    def most_routed(self) -> list[Key]:
        """The experts routed to most, as many as the cache holds: what a new run starts with."""
        return [key for key, _ in self.counts.most_common(self.capacity)]


def counts_path(layer_file: Path) -> Path:
    """Where a model's routing counts are kept: beside its layer file."""
    return layer_file.with_suffix(".routes.json")


def read_counts(path: Path) -> Counter:
    """The counts a run left at `path`; none when there is no such file."""
    if not path.is_file():
        return Counter()
    rows = json.loads(path.read_text())
    return Counter({(layer, expert): count for layer, expert, count in rows})


def write_counts(path: Path, counts: Counter) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps([[layer, expert, count] for (layer, expert), count in counts.items()]))
    partial.replace(path)  # atomic: a run killed meanwhile leaves the last whole file
