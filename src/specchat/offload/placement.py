"""Where a model's decoder layers are, as the memory plan (specchat.plan) placed them: the
streaming's one input. `resident` layers live on the device, spread among the streamed ones
(`streamed_indices`; a MoE model streamed by expert keeps its first ones); of the streamed, in
compute order, the first `ram` stream from pinned RAM, the rest from the layer file, through a
ring of slots on the device. A MoE layer streamed by expert moves its head and the experts its
tokens route to: a pass's bytes then depend on the share of the experts it touches.

Why spread. The ring's slots hold the next streamed layers, loaded while the draft grows its tree,
so a pass begins with them full: the link can load the next layer only once compute releases a
slot. Resident layers first (layers 0 .. resident-1, as placed until 2026-12-01) computed while the
link waited with nothing to load into: on an H200 the paper's 70B target with 15 resident layers
spent ~78 ms of each ~0.66 s pass so (docs/benchmarks.md, the traced pass). Spread evenly among
the streamed, a resident layer computes while the link loads the next streamed layer into the slot
the last one freed, so a pass bound by the link streams from its start to its end: with the traced
pass's figures (2 slots, 8.3 ms a layer's load, 5.2 ms its compute) 539 ms against 611 in virtual
time (tests/offload/test_streamer.py), a ring of 17 slots and no resident layer 533."""

from dataclasses import dataclass
from functools import cached_property

from specchat.transfer import gb


@dataclass(frozen=True)
class Placement:
    layers: tuple[int, ...]  # bytes of each decoder layer
    resident: int  # layers that live on the device (which: resident_layers)
    ram: int  # the first `ram` streamed layers stream from pinned RAM
    disk: int  # the other `disk` streamed layers stream from the layer file
    slots: int  # ring slots on the device (0 when nothing streams)
    slot_bytes: int
    needed: int  # bytes the device pool holds: fixed parts, headroom, resident layers, the ring (and, on a CPU, the ram tier)
    heads: tuple[int, ...] = ()  # each MoE layer's head (the rest is its experts); () when every layer moves whole
    expert_cache: int = 0  # bytes on the device for the most-routed experts of streamed layers (offload/expert_cache.py)

    @cached_property  # worked out once: the build asks for each layer whether it streams
    def streamed(self) -> tuple[int, ...]:
        return streamed_indices(len(self.layers), self.resident, bool(self.heads))

    @cached_property
    def resident_layers(self) -> tuple[int, ...]:
        return resident_indices(len(self.layers), self.resident, bool(self.heads))

    @property
    def ram_layers(self) -> tuple[int, ...]:
        return self.streamed[:self.ram]

    @property
    def disk_layers(self) -> tuple[int, ...]:
        return self.streamed[self.ram:]

    def streamed_bytes(self, layers: tuple[int, ...], expert_share: float = 1.0) -> float:
        """Bytes a pass streams of `layers`: a MoE layer's head and `expert_share` of its experts."""
        heads = self.heads or self.layers
        return sum(heads[i] + expert_share * (self.layers[i] - heads[i]) for i in layers)

    @property
    def resident_bytes(self) -> int:
        return resident_bytes(self.layers, self.resident, self.heads)

    @property
    def ram_bytes(self) -> int:
        return sum(self.layers[i] for i in self.ram_layers)

    @property
    def disk_bytes(self) -> int:
        return sum(self.layers[i] for i in self.disk_layers)

    @property
    def pass_bytes(self) -> int:
        """Bytes one target pass streams at most (every expert of a MoE layer routed to)."""
        return self.ram_bytes + self.disk_bytes

    def expected_pass_s(self, ram_gbps: float | None, disk_gbps: float | None,
                        expert_share: float = 1.0) -> float | None:
        """Seconds one pass spends streaming at the given link speeds, `expert_share` of each MoE
        layer's experts routed to; None when a needed speed is unknown. With staging, drafting
        hides up to this much of it (of a MoE layer's, only its head)."""
        if (self.ram and not ram_gbps) or (self.disk and not disk_gbps):
            return None
        ram_s = self.streamed_bytes(self.ram_layers, expert_share) / (ram_gbps * 1e9) if self.ram else 0.0
        return ram_s + (self.streamed_bytes(self.disk_layers, expert_share) / (disk_gbps * 1e9) if self.disk else 0.0)

    def describe(self, ram_gbps: float | None = None, disk_gbps: float | None = None) -> str:
        """One line: layers per tier, the ring, bytes per pass and the expected pass time."""
        tiers = f"{self.resident} resident, {self.ram} in RAM, {self.disk} on disk"
        if not self.streamed:
            return f"{len(self.layers)} decoder layers: {tiers}; nothing streams"
        staged = "a whole pass" if self.slots == len(self.streamed) else f"{self.slots} of {len(self.streamed)} layers"
        seconds = self.expected_pass_s(ram_gbps, disk_gbps)
        timing = "" if seconds is None else f", ~{seconds:.2f} s per pass at {link_speeds(self, ram_gbps, disk_gbps)}"
        return (f"{len(self.layers)} decoder layers: {tiers}; ring of {self.slots} slots (stages {staged}); "
                f"{gb(self.pass_bytes)} streamed per pass{timing}")


def streamed_indices(count: int, resident: int, by_expert: bool = False) -> tuple[int, ...]:
    """Which of `count` layers stream when `resident` stay on the device, in compute order: spread
    evenly from the first (layer k count // streamed for k < streamed), so that between two
    streamed layers the resident ones compute while the link loads (the module's docstring). A MoE
    model streamed `by_expert` streams its last layers, its first ones resident: its MoE layers
    move only the experts a pass routes to, its dense ones all their bytes, and dense layers come
    first where a model has both (DeepSeek's first layers; an upcycled model's, tests/real)."""
    streamed = count - resident
    if by_expert:
        return tuple(range(resident, count))
    return tuple(k * count // streamed for k in range(streamed))


def resident_indices(count: int, resident: int, by_expert: bool = False) -> tuple[int, ...]:
    """The layers that stay on the device when `resident` of `count` do: those streamed_indices leaves."""
    streamed = set(streamed_indices(count, resident, by_expert))
    return tuple(index for index in range(count) if index not in streamed)


def resident_bytes(layers: tuple[int, ...], resident: int, heads: tuple[int, ...] = ()) -> int:
    """Bytes of the layers (each's bytes in `layers`) that stay on the device when `resident` do;
    `heads`: a MoE model's, streamed by expert (none: a dense model's)."""
    return sum(layers[index] for index in resident_indices(len(layers), resident, bool(heads)))


def streamed_sizes(layers: tuple[int, ...], resident: int, heads: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Bytes of each streamed layer, in compute order, when `resident` of `layers` stay on the device."""
    return tuple(layers[index] for index in streamed_indices(len(layers), resident, bool(heads)))


def link_speeds(placement: Placement, ram_gbps: float | None, disk_gbps: float | None) -> str:
    speeds = ([f"{ram_gbps:.2f} GB/s from RAM"] if placement.ram else []) + \
             ([f"{disk_gbps:.2f} GB/s from disk"] if placement.disk else [])
    return " and ".join(speeds)
