"""The machine a plan is made for, and what each of its tiers offers: this machine, measured
when the plan is made (free RAM and cgroup limits, the GPU's free memory, the free disk), or one
described by its sizes (`specchat doctor --vram-gb --ram-gb`, or a room given whole)."""

import shutil
from dataclasses import dataclass, replace

import torch

from specchat.cuda_device import cuda_usable
from specchat.memory_room import Room, ram_room
from specchat.offload.cuda import free_bytes
from specchat.plan.budget import OS_RESERVE
from specchat.plan.placement import Rooms
from specchat.plan.request import PlanRequest
from specchat.transfer import gb, gb_to_bytes

RUNTIME_BYTES = 15 * 10**8  # python, torch, transformers and the tokenizer: counted on a described machine
# Under a cgroup limit the page cache the run itself reads through (the checkpoint, the layer
# file, the tokenizer) is charged to the limit too; with none left it thrashes: alone under a
# 2.10 GB limit the default pair sat at the limit (rss 1.85 GB) and finished in 101 s, beside other
# jobs it produced no token in 15 minutes. The plan keeps this share of the limit for it.
PAGE_CACHE_SHARE = 0.15


@dataclass(frozen=True)
class Machine:
    """Where to plan (GB = 1e9 bytes): this machine when nothing describes it; a GPU machine by
    `vram_gb` and `ram_gb`, a CPU-only one by `ram_gb` alone; or this machine's CPU with `rooms`
    in place of what it measures (a memory limit it would run under)."""

    vram_gb: float | None = None
    ram_gb: float | None = None
    disk_gbps: float | None = None
    pcie_gbps: float | None = None
    rooms: Rooms | None = None
    kind: str | None = None  # this machine's device of this kind ("cpu", "cuda"); None: its GPU when torch sees one

    @property
    def described(self) -> bool:
        """Described by its sizes: not this machine."""
        return self.ram_gb is not None or self.vram_gb is not None

    def device(self) -> torch.device:
        """The compute device the plan is for: a described machine's, a room's (a CPU), or this one's."""
        if self.described:
            return torch.device("cuda" if self.vram_gb is not None else "cpu")
        if self.rooms is not None:
            return torch.device("cpu")
        return torch.device(self.kind or ("cuda" if cuda_usable() else "cpu"))

    def tiers(self, request: PlanRequest, reusable_file: int) -> Rooms:
        """What each tier offers: as given or described, or measured now (a reusable layer file of
        `reusable_file` bytes counts as free disk)."""
        if self.rooms is not None:
            return self.rooms
        if self.described:
            return within_budgets(described_rooms(gb_to_bytes(self.vram_gb), gb_to_bytes(self.ram_gb)), request)
        return measure_rooms(request, self.device(), reusable_file)


def measure_rooms(request: PlanRequest, device: torch.device, reusable_file: int) -> Rooms:
    """What each tier offers now: the RAM this process may take (cgroup limits included, less
    PAGE_CACHE_SHARE of the limit), or the budget when it is smaller, less what the OS keeps on a
    CPU when the host's RAM bounds it (a container's OS lives outside its limit; beside a GPU the
    plan counts it); the GPU's free memory or its budget; the free disk, where a reusable layer
    file counts as free. What the process already holds (python, torch, transformers, the
    tokenizer) is outside the room: available RAM and a cgroup's usage both count it."""
    cpu = device.type != "cuda"
    ram = kept_for_page_cache(ram_room())
    if cpu and ram.limit is None:
        ram = Room(ram.bytes - OS_RESERVE, f"RAM ({ram.bound}, less {gb(OS_RESERVE)} for the OS)")
    disk_dir = next(path for path in (request.offload_dir, *request.offload_dir.parents) if path.exists())
    disk = shutil.disk_usage(disk_dir).free + reusable_file
    disk_name = str(request.offload_dir)
    if cpu:
        return within_budgets(Rooms(ram.bytes, None, disk, ram.bound, ram.bound, disk_name), request)
    free = free_bytes(device)
    return within_budgets(Rooms(free, ram.bytes, disk, f"GPU memory ({gb(free)} free)", f"RAM ({ram.bound})",
                                disk_name), request)


def kept_for_page_cache(ram: Room) -> Room:
    """`ram` less PAGE_CACHE_SHARE of its cgroup limit, when a limit bounds it."""
    if ram.limit is None:
        return ram
    kept = int(PAGE_CACHE_SHARE * ram.limit)
    return Room(max(0, ram.bytes - kept), f"{ram.bound}, less {gb(kept)} kept for the page cache", ram.limit)


def within_budgets(rooms: Rooms, request: PlanRequest) -> Rooms:
    """`rooms` (measured or described) under --vram-budget (the GPU's) and --ram-budget (the RAM:
    on a CPU its device, beside a GPU its host), where a budget is the smaller."""
    if rooms.host is None:
        device, device_name = capped(rooms.device, rooms.device_name, request.ram_budget_bytes, "RAM", "--ram-budget")
        return replace(rooms, device=device, device_name=device_name, host_name=device_name)
    device, device_name = capped(rooms.device, rooms.device_name, request.vram_budget_bytes, "GPU memory",
                                 "--vram-budget")
    host, host_name = capped(rooms.host, rooms.host_name, request.ram_budget_bytes, "RAM", "--ram-budget")
    return replace(rooms, device=device, device_name=device_name, host=host, host_name=host_name)


def capped(room: int, name: str, budget_bytes: int | None, what: str, option: str) -> tuple[int, str]:
    """min(room, budget_bytes), named as an error should name it."""
    if budget_bytes is not None and budget_bytes <= room:
        return budget_bytes, f"{what} under {option} {budget_bytes / 1e9:g} GB"
    return room, name


def described_rooms(vram: int | None, ram: int, disk: int | None = None) -> Rooms:
    """The rooms of a machine described by its sizes: its RAM less the runtime's own footprint
    (and, on a CPU, what the OS keeps); a disk of `disk` free bytes, or one with room for any
    layer file when None."""
    disk_bytes = disk if disk is not None else 2**62
    usable = ram - RUNTIME_BYTES
    ram_name = f"RAM ({gb(ram)}, less {gb(RUNTIME_BYTES)} for specchat's runtime)"
    if vram is None:
        return Rooms(usable - OS_RESERVE, None, disk_bytes, ram_name[:-1] + f" and {gb(OS_RESERVE)} for the OS)",
                     disk_name="the disk")
    return Rooms(vram, usable, disk_bytes, f"GPU memory ({gb(vram)})", ram_name, "the disk")
