"""Streaming by expert: a MoE layer's ring load brings only its head (attention, norms, router,
shared expert), and each call of the layer fetches the experts its router picked, and only those,
into the slot it computes in, the later ones loading while the first ones compute.

A slot keeps the experts it fetched for as long as it holds the same layer, since a ring load
writes only the head: a ring that stages a whole pass fetches each expert of a layer once, and a
smaller ring fetches what each call routes to.
"""

from typing import Any

from torch import nn

from specchat.quant.split_experts import SplitExperts

# Experts whose units lie next to each other are read in one request up to this size: fewer
# requests, while the first experts of a call still arrive early enough for compute to start.
FETCH_RUN_BYTES = 16 * 2**20


def expert_units(layer: nn.Module) -> dict[str, int]:
    """The state_dict names of `layer`'s per-expert tensors, each with its expert."""
    units = {}
    for prefix, module in layer.named_modules():
        if isinstance(module, SplitExperts):
            units |= {f"{prefix}.{name}": int(name.split(".")[0]) for name in module.state_dict()}
    return units


def split_experts_of(layer: nn.Module) -> SplitExperts | None:
    return next((module for module in layer.modules() if isinstance(module, SplitExperts)), None)


class SlotExperts:
    """Which experts each ring slot holds, and for which layer."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[int, set[int]]] = {}

    def enter(self, slot: int, layer: int) -> set[int]:
        """The experts `slot` holds for `layer`, now that compute holds it for that layer: none if
        another layer was there last (its ring load may have left anything in the units)."""
        held = self.held.get(slot)
        if held is None or held[0] != layer:
            held = self.held[slot] = (layer, set())
        return held[1]


class ExpertLoads:
    """The ExpertFeed of one call of a layer streamed by expert (`streamer` as offload/streamer's
    Streamer: fetch, wait)."""

    def __init__(self, streamer: Any, layer: int, slot: int, units: tuple[tuple[int, int], ...],
                 held: set[int]) -> None:
        self.streamer = streamer
        self.layer = layer
        self.slot = slot
        self.units = units
        self.held = held
        self.tickets: dict[int, Any] = {}

    def start(self, experts: list[int]) -> None:
        for run in runs([e for e in experts if e not in self.held], self.units):
            ticket = self.streamer.fetch(self.layer, self.slot, [self.units[expert] for expert in run])
            self.tickets |= {expert: ticket for expert in run}

    def wait(self, expert: int) -> None:
        ticket = self.tickets.pop(expert, None)
        if ticket is not None:
            self.streamer.wait(ticket)
            self.held.add(expert)

    def settle(self) -> None:
        pending, self.tickets = self.tickets, {}
        for ticket in {id(t): t for t in pending.values()}.values():
            self.streamer.wait(ticket)


def runs(experts: list[int], units: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """`experts` (ascending) in runs of consecutive ones, each fetched as one request (a disk store
    reads it in one read: consecutive units lie back to back, each starting on the direct-I/O
    boundary after the one before), up to FETCH_RUN_BYTES a run."""
    grouped: list[list[int]] = []
    for expert in experts:
        last = grouped[-1] if grouped else None
        if last and last[-1] == expert - 1 and units[expert][1] - units[last[0]][0] <= FETCH_RUN_BYTES:
            last.append(expert)
        else:
            grouped.append([expert])
    return grouped
