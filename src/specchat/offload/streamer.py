"""The layer streamer: a ring of device slots that layers flow through, loads running ahead.

Scheduling is the same on every device; only the transport (how bytes reach a slot and how
compute waits for them) differs. Streamed layers are loaded in their cyclic compute order (the
streamed ones first to last, resident layers between them, then the first again): when compute
releases a slot, the next layer in that order is loaded into it at once. So while a streamed
layer computes, the next S-1 streamed layers are in flight (and resident layers compute while
they load), and the loads that follow the last streamed layer of a pass are the first ones of
the next pass: they arrive while the draft tree is being built. The ring is the staging area:
with as many slots as streamed layers, a whole pass is staged while the tree grows, and a pass
after drafting that lasted long enough never waits on the link.

The stall is the time compute waited for a layer, measured by a `StallMeter`: the host clock on
a CPU, the compute stream's events on CUDA (where the host blocking in a wait may overlap the
device still computing earlier layers, which is no stall). The wait for a pass's first streamed
layer is metered apart (`start_stall_s`): it is what drafting left the link to do, the part of the
stall that staging during the tree's growth is meant to remove.

The link is idle when it moves nothing while a layer still has to be moved. With a slot per
streamed layer, the loader stops only once the whole next pass is staged (nothing left to move);
with fewer slots, a layer the next pass needs always waits for room, so every moment the loader
is not busy is idle.
"""

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol

from specchat.offload.stall import HostStallMeter, StallMeter
from specchat.transfer import TransferStats


class Transport(Protocol):
    """Moves a layer's bytes into a slot, asynchronously."""

    def begin(self, layer: int, slot: int, whole: bool) -> Any:
        """Start loading `layer` into `slot` (all of it if `whole`, else what its ring load moves);
        returns a ticket. The slot is free when called."""

    def fetch(self, layer: int, slot: int, ranges: list[tuple[int, int]]) -> Any:
        """Start loading byte ranges of `layer` into `slot`, which compute holds, ahead of the
        queued loads; returns a ticket for `finish`."""

    def finish(self, ticket: Any) -> None:
        """Make compute wait until the ticket's layer (or ranges) is usable in its slot: work it
        queues after this runs after they land."""

    def retire(self, slot: int) -> None:
        """Compute has been issued on `slot`'s contents; later loads may overwrite it after that."""

    def stats(self) -> TransferStats:
        """Bytes of the loads issued so far and the link's busy seconds (moving bytes, not
        waiting for compute to free a slot), the load in progress included (stall_s and idle_s
        are the streamer's)."""


@dataclass
class _Load:
    layer: int
    slot: int
    ticket: Any
    whole: bool


class Streamer:
    """Hands out slots holding the layers `order` in turn, keeping the other slots loading."""

    def __init__(self, order: Sequence[int], slots: int, transport: Transport,
                 clock: Callable[[], float] = perf_counter, meter: StallMeter | None = None,
                 fetch_meter: StallMeter | None = None, start_meter: StallMeter | None = None):
        if slots < 1:
            raise ValueError("the ring needs at least one slot")
        self.order = order
        self.slots = min(slots, len(order))
        self.transport = transport
        self.clock = clock
        self.position = {layer: i for i, layer in enumerate(order)}
        self.pending: deque[_Load] = deque()
        self.cursor = 0  # index in `order` of the next layer to load
        self.meter = meter if meter is not None else HostStallMeter(clock)  # waits for a layer's ring load
        self.fetch_meter = fetch_meter if fetch_meter is not None else HostStallMeter(clock)  # for fetched experts
        self.start_meter = start_meter if start_meter is not None else HostStallMeter(clock)  # for a pass's first layer
        self.started = clock()
        self.whole = False  # the loads submitted from now on move whole layers (a wide pass's)
        self.arrived_whole: dict[int, bool] = {}  # per slot: its last ring load moved the whole layer
        self.fill(0)

    def fill(self, start: int) -> None:
        """Load the first `slots` layers from order[start] on, one per slot."""
        self.cursor = start
        for slot in range(self.slots):
            self.submit(slot)

    def submit(self, slot: int) -> None:
        layer = self.order[self.cursor]
        self.pending.append(_Load(layer, slot, self.transport.begin(layer, slot, self.whole), self.whole))
        self.cursor = (self.cursor + 1) % len(self.order)

    def acquire(self, layer: int) -> int:
        """The slot holding `layer`, once it has arrived (compute waits, and that is a stall)."""
        if not self.pending or self.pending[0].layer != layer:
            self.resync(layer)
        load = self.pending.popleft()
        meter = self.start_meter if layer == self.order[0] else self.meter
        mark = meter.start()
        self.transport.finish(load.ticket)
        meter.stop(mark)
        self.arrived_whole[load.slot] = load.whole
        return load.slot

    def fetch(self, layer: int, slot: int, ranges: list[tuple[int, int]]) -> Any:
        """Ask for more of `layer` (its routed experts' units) in the slot compute holds; `wait`
        for the ticket before reading them."""
        return self.transport.fetch(layer, slot, ranges)

    def wait(self, ticket: Any) -> None:
        """Compute waits for a fetch, and that is a stall too, counted apart: what fetching on demand
        costs a pass, which no staging hides."""
        mark = self.fetch_meter.start()
        self.transport.finish(ticket)
        self.fetch_meter.stop(mark)

    def release(self, slot: int) -> None:
        """Compute on `slot` has been issued: reuse the slot for the next layer in order."""
        self.transport.retire(slot)
        self.submit(slot)

    def resync(self, layer: int) -> None:
        """Called out of order (a pass was abandoned midway): wait out the loads in flight, so
        none writes into a slot about to be reused, and restart the ring at `layer`."""
        if layer not in self.position:
            raise KeyError(f"layer {layer} is not streamed")
        while self.pending:
            self.transport.finish(self.pending.popleft().ticket)
        self.fill(self.position[layer])

    @property
    def stages_a_pass(self) -> bool:
        """True when the ring holds every streamed layer: the next pass is staged whole."""
        return self.slots >= len(self.order)

    def stats(self) -> TransferStats:
        moved = self.transport.stats()
        idle = 0.0 if self.stages_a_pass else max(0.0, self.clock() - self.started - moved.transfer_s)
        fetch_wait, start_stall = self.fetch_meter.seconds(), self.start_meter.seconds()
        return TransferStats(moved.bytes, moved.transfer_s, self.meter.seconds() + start_stall + fetch_wait, idle,
                             moved.fetched_bytes, fetch_wait, start_stall)

    def drain(self) -> None:
        """Wait for every load in flight (before freeing the slots)."""
        for load in self.pending:
            self.transport.finish(load.ticket)
