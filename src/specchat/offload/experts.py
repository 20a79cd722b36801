"""Streaming by expert: a MoE layer's ring load brings only its head (attention, norms, router,
shared expert), and each call of the layer fetches the experts its router picked, and only those,
into the slot it computes in, the later ones loading while the first ones compute.

A slot keeps the experts it fetched for as long as it holds the same layer, since a ring load
writes only the head: a ring that stages a whole pass fetches each expert of a layer once, and a
smaller ring fetches what each call routes to. Where the plan left room, the most-routed experts
also wait on the device (offload/expert_cache.py) and are copied into the slot from there.

A wide pass can route to nearly every expert, and fetching them once its routers have run keeps
compute waiting, where a ring load of the whole layer would have arrived while earlier layers
computed: on an H200 (pinned RAM) a Mixtral-shaped layer took 14.5-18.7 ms by expert against
12.6-17.2 whole from 64 tokens (6.0 against 11.6 at one token). So a call that routed to
WHOLE_SHARE of its layer's experts has the ring loads its release starts move whole layers, at most
1/WHOLE_SHARE of the bytes fetching would move, and a slot loaded so holds every expert. The rule
reads the routing itself, not an expectation: random weights route far from uniformly (a
Qwen3-30B-A3B-shaped 64-token pass reached ~22 of 128 experts a layer, where uniform routing
reaches 126), and there whole loads made the CPU's disk-tier pass 1.8x slower. The share is 0.85,
so that 7 of 8 experts count: SpecExec's 64-token trees over a real-weights 8-expert top-2 target
(the 1.5B upcycled, scripts/bench_moe_specexec.py) reached 7 or 8 a layer, and at 0.9 (8 of 8)
their passes kept fetching after their routers and ran slower on the CPU's disk tier, in one run
beside 0.85 (docs/benchmarks.md). Not where the ring stages a whole pass, whose slots keep their
layers' experts from pass to pass, nor where the expert cache holds a good share of them
(offload/build.py).
"""

from typing import Any

import torch
from torch import nn

from specchat.offload.expert_cache import ExpertCache
from specchat.quant.split_experts import SplitExperts

# Experts whose units lie next to each other are read in one request up to this size: fewer
# requests, while the first experts of a call still arrive early enough for compute to start.
FETCH_RUN_BYTES = 16 * 2**20
# The share of a layer's experts a call routed to from which the ring loads it starts move whole
# layers: at most 1/0.85 of the bytes fetching would move, ahead of compute instead of while it waits.
WHOLE_SHARE = 0.85


def split_experts_of(layer: nn.Module) -> SplitExperts | None:
    return next((module for module in layer.modules() if isinstance(module, SplitExperts)), None)


class SlotExperts:
    """Which experts each ring slot holds, and for which layer; and whether a call that routed to
    WHOLE_SHARE of its experts has the ring load whole layers (`whole_loads`)."""

    def __init__(self, whole_loads: bool = False) -> None:
        self.held: dict[int, tuple[int, set[int]]] = {}
        self.whole_loads = whole_loads

    def loads_whole(self, routed: int, experts: int) -> bool:
        """Whether the ring loads that follow a call routed to `routed` of `experts` move whole layers."""
        return self.whole_loads and routed >= WHOLE_SHARE * experts

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
        self.routed = 0  # the experts the call routed to

    def start(self, experts: list[int]) -> None:
        self.routed = len(experts)
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
