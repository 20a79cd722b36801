"""Streaming by expert: a MoE layer's ring load brings only its head (attention, norms, router,
shared expert), and each call of the layer fetches the experts its router picked, and only those,
into the slot it computes in, the later ones loading while the first ones compute.

A slot keeps the experts it fetched for as long as it holds the same layer, since a ring load
writes only the head: a ring that stages a whole pass fetches each expert of a layer once, and a
smaller ring fetches what each call routes to. Where the plan left room, the most-routed experts
also wait on the device (offload/expert_cache.py) and are copied into the slot from there.

A wide pass routes to nearly every expert, and fetching them once its routers have run keeps
compute waiting, where a ring load of the whole layer would have arrived while earlier layers
computed: on an H200 (pinned RAM) a Mixtral-shaped layer took 6.0 ms by expert and 11.6 whole at
one token, but 14.5-18.7 by expert against 12.6-17.2 whole from 64 tokens; on this project's CPU
(disk tier) a Qwen3-30B-A3B-shaped target's 64-token pass took 6.97 s against 4.52. So once a pass is
expected to route to WHOLE_SHARE of a layer's experts, the ring loads it starts move whole layers
(`whole_layer_tokens`), and a slot loaded so holds every expert; not where the ring stages a whole
pass, whose slots keep their layers' experts from pass to pass, nor where the expert cache holds
a good share of them (offload/build.py).
"""

import math
from typing import Any

import torch
from torch import nn

from specchat.offload.expert_cache import ExpertCache
from specchat.quant.split_experts import SplitExperts

# Experts whose units lie next to each other are read in one request up to this size: fewer
# requests, while the first experts of a call still arrive early enough for compute to start.
FETCH_RUN_BYTES = 16 * 2**20
# The expected share of a layer's experts from which a pass's ring loads move whole layers: they
# move at most 1/0.9 of the bytes fetching would, ahead of compute instead of while it waits.
WHOLE_SHARE = 0.9


def whole_layer_tokens(experts: int, routed: int) -> int:
    """The fewest tokens a pass is expected to route to WHOLE_SHARE of `experts` with (each token to
    `routed` of them, uniformly: 1 - (1 - k/E)^n of them): n >= log(1 - s) / log(1 - k/E)."""
    if routed >= experts:
        return 1
    missed = 1 - routed / experts  # by one token, a given expert
    tokens = max(1, math.ceil(math.log(1 - WHOLE_SHARE) / math.log(missed)))
    return tokens if 1 - missed ** tokens >= WHOLE_SHARE else tokens + 1  # the logarithms' rounding at the edge


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
    """Which experts each ring slot holds, and for which layer; and from how many tokens a pass's
    ring loads move whole layers (`whole_from`; inf: never)."""

    def __init__(self, whole_from: float = math.inf) -> None:
        self.held: dict[int, tuple[int, set[int]]] = {}
        self.whole_from = whole_from

    def enter(self, slot: int, layer: int, experts: int = 0) -> set[int]:
        """The experts `slot` holds for `layer`, now that compute holds it for that layer: all
        `experts` of them if its ring load moved the whole layer, else none if another layer was
        there last (its ring load may have left anything in the units)."""
        held = self.held.get(slot)
        if held is None or held[0] != layer or experts:
            held = self.held[slot] = (layer, set(range(experts)))
        return held[1]


class ExpertLoads:
    """The ExpertFeed of one call of a layer streamed by expert (`streamer` as offload/streamer's
    Streamer: fetch, wait) computing in ring slot `slot`, whose buffer is `buffer`."""

    def __init__(self, streamer: Any, layer: int, slot: int, buffer: torch.Tensor, units: tuple[tuple[int, int], ...],
                 held: set[int], cache: ExpertCache | None = None) -> None:
        self.streamer = streamer
        self.layer = layer
        self.slot = slot
        self.buffer = buffer
        self.units = units
        self.held = held
        self.cache = cache
        self.tickets: dict[int, Any] = {}

    def start(self, experts: list[int]) -> None:
        if self.cache is not None:
            self.cache.count(self.layer, experts)
        missing = [expert for expert in experts if expert not in self.held and not self.copy_cached(expert)]
        for run in runs(missing, self.units):
            ticket = self.streamer.fetch(self.layer, self.slot, [self.units[expert] for expert in run])
            self.tickets |= {expert: ticket for expert in run}

    def copy_cached(self, expert: int) -> bool:
        """Copy `expert` into the slot from the cache on the device, if it is there (on CUDA the copy
        runs on the compute stream, before the products that read it)."""
        cached = None if self.cache is None else self.cache.find(self.layer, expert)
        if cached is None:
            return False
        start, end = self.units[expert]
        self.buffer[start:end].copy_(cached[: end - start])
        self.held.add(expert)
        return True

    def wait(self, expert: int) -> None:
        ticket = self.tickets.pop(expert, None)
        if ticket is not None:
            self.streamer.wait(ticket)
            self.held.add(expert)
            if self.cache is not None:
                start, end = self.units[expert]
                self.cache.offer(self.layer, expert, self.buffer[start:end])

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
