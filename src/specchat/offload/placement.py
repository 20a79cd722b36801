"""Where a model's decoder layers are, as the memory plan (specchat.plan) placed them: the
streaming's one input. Layers 0 .. resident-1 live on the device, the next ones stream from
pinned RAM, the last ones from the layer file, through a ring of slots on the device."""

from dataclasses import dataclass

from specchat.transfer import gb


@dataclass(frozen=True)
class Placement:
    layers: tuple[int, ...]  # bytes of each decoder layer
    resident: int  # layers 0 .. resident-1 live on the device
    ram: int  # the next `ram` layers stream from pinned RAM
    disk: int  # the last `disk` layers stream from the layer file
    slots: int  # ring slots on the device (0 when nothing streams)
    slot_bytes: int
    needed: int  # bytes the device pool holds: fixed parts, headroom, resident layers, the ring (and, on a CPU, the ram tier)

    @property
    def streamed(self) -> list[int]:
        return list(range(self.resident, len(self.layers)))

    @property
    def ram_layers(self) -> list[int]:
        return list(range(self.resident, self.resident + self.ram))

    @property
    def disk_layers(self) -> list[int]:
        return list(range(self.resident + self.ram, len(self.layers)))

    @property
    def ram_bytes(self) -> int:
        return sum(self.layers[i] for i in self.ram_layers)

    @property
    def disk_bytes(self) -> int:
        return sum(self.layers[i] for i in self.disk_layers)

    @property
    def pass_bytes(self) -> int:
        """Bytes one target pass streams."""
        return self.ram_bytes + self.disk_bytes

    def expected_pass_s(self, ram_gbps: float | None, disk_gbps: float | None) -> float | None:
        """Seconds one pass spends streaming at the given link speeds; None when a needed speed
        is unknown. With staging, drafting hides up to this much of it."""
        if (self.ram and not ram_gbps) or (self.disk and not disk_gbps):
            return None
        ram_s = self.ram_bytes / (ram_gbps * 1e9) if self.ram else 0.0
        return ram_s + (self.disk_bytes / (disk_gbps * 1e9) if self.disk else 0.0)

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


def link_speeds(placement: Placement, ram_gbps: float | None, disk_gbps: float | None) -> str:
    speeds = ([f"{ram_gbps:.2f} GB/s from RAM"] if placement.ram else []) + \
             ([f"{disk_gbps:.2f} GB/s from disk"] if placement.disk else [])
    return " and ".join(speeds)
