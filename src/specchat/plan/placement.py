"""Where a model's decoder layers go: each into the fastest tier with room, those kept on the
device spread among the streamed ones (offload/placement.py: a resident layer computes while the
link loads the next streamed one).

Tiers, fastest first: the compute device (resident layers; on a CPU the RAM is the device),
pinned RAM beside a GPU (streamed over PCIe), the disk layer file (streamed with O_DIRECT).
The device always holds the parts outside the layers (embeddings, final norm, LM head) and keeps
headroom for both KV caches at the context length and for the largest tree's activations.
Streamed layers pass through a ring of slots on the device; the ring is also the staging area
that fills with the next pass's layers while the draft tree grows, so an explicit tier gets as
many slots as the room left allows, up to a whole pass. Under --offload auto a byte of RAM is
worth at least as much as a resident layer as in a staging slot (both save one layer's transfer
per pass; the slot only while drafting lasts long enough to fill it), so residents come first
and the ring keeps what is left.

Beside a GPU, the RAM tier and the disk reads' staging are pinned, and CUDA's pinned (caching
host) allocator rounds every allocation up to a power of two: a 445 MB staging buffer pins 512
MiB. The RAM tier's layers are laid end to end in a few buffers that are powers of two themselves
(offload/pinned_chunks.py). The host tier is counted as it is allocated.

Pure arithmetic on byte counts: nothing is loaded, written or allocated here.
"""

from dataclasses import dataclass
from typing import Literal

from specchat.errors import PlanRefusal, SpecchatError
from specchat.offload.pinned_chunks import pinned_bytes, pinned_tier_bytes
from specchat.offload.direct_io import align_up
from specchat.offload.placement import Placement, resident_bytes, streamed_sizes
from specchat.transfer import gb

TierRequest = Literal["auto", "ram", "disk"]
MIN_SLOTS = 2  # one slot computing while the next one loads


@dataclass(frozen=True)
class ModelSizes:
    """What a model needs, in bytes, for one dtype, context length and largest tree."""

    layers: tuple[int, ...]  # each decoder layer's weights
    fixed: int  # weights outside the decoder layers: always on the device
    headroom: int  # everything else the device holds: KV caches, the largest pass, the draft, margins (plan/budget.py)
    file_bytes: int  # the disk tier's layer file (every layer, each padded to the O_DIRECT alignment)
    heads: tuple[int, ...] = ()  # a MoE model's layers' heads, streamed by expert (offload/experts.py); () for a dense one


@dataclass(frozen=True)
class Rooms:
    """What specchat may take in each tier, in bytes, and how to name it in an error."""

    device: int  # on the compute device (on a CPU: RAM)
    host: int | None  # pinned RAM beside a GPU; None on a CPU, where the RAM is the device
    disk: int  # free space for the layer file (an existing, reusable layer file counts as free)
    device_name: str = "RAM"  # e.g. "RAM (--ram-budget 4.00 GB)"
    host_name: str = "RAM"
    disk_name: str = "the offload directory"


@dataclass(frozen=True)
class Request:
    """The placement's share of a run's options (plan/request.PlanRequest.placement_request makes
    it): where streamed layers go, how many stay on the device, the ring."""

    tier: TierRequest = "auto"  # --offload, but none, which is every layer resident
    resident_layers: int | None = None  # --resident-layers; None: as many as fit
    slots: int | None = None  # ring slots; None: sized by the room left


def fit(layers: tuple[int, ...], room: int, heads: tuple[int, ...] = ()) -> int:
    """How many layers fit in `room` bytes as they are kept on the device (resident_indices)."""
    return next((count for count in range(len(layers), 0, -1) if resident_bytes(layers, count, heads) <= room), 0)


def place(sizes: ModelSizes, rooms: Rooms, request: Request = Request()) -> Placement:
    """The placement of `sizes`' layers in `rooms`; one-line SpecchatError when they do not fit."""
    count = len(sizes.layers)
    reserved = sizes.fixed + sizes.headroom
    device_room = rooms.device - reserved
    if device_room < 0:
        raise PlanRefusal(f"{rooms.device_name} is too small for the model: its embeddings, LM head, KV caches "
                          f"and largest tree need {gb(reserved)}", "device", -device_room)
    slot = align_up(max(sizes.layers))
    resident = choose_resident(sizes, device_room, slot, request)
    streamed = count - resident
    on_device = resident_bytes(sizes.layers, resident, sizes.heads)
    check_resident_fit(on_device, resident, device_room - (min(MIN_SLOTS, streamed) * slot), rooms)
    if streamed == 0:
        return Placement(sizes.layers, count, 0, 0, 0, slot, reserved + sum(sizes.layers), sizes.heads)
    device_left = device_room - on_device
    moving = streamed_sizes(sizes.layers, resident, sizes.heads)
    if rooms.host is None and request.tier == "ram":  # on a CPU the ram tier's layers are in RAM too
        ram = choose_ram(moving, device_left - MIN_SLOTS * slot, 0, request, rooms)
        slots = choose_slots(request, streamed, device_left - sum(moving), slot, rooms)
    else:
        slots = choose_slots(request, streamed, device_left, slot, rooms)
        # on a CPU a layer in RAM is a resident layer: what is not resident goes to disk
        ram = 0 if rooms.host is None else choose_ram(moving, rooms.host, slots * pinned_bytes(slot), request, rooms)
    disk = streamed - ram
    if rooms.host is not None and host_bytes(moving[:ram], slots if disk else 0, slot) > rooms.host:
        raise PlanRefusal(f"{rooms.host_name} is too small for the staging of disk reads: {slots} pinned buffers of "
                          f"{gb(slot)} take {gb(slots * pinned_bytes(slot))}", "host",
                          host_bytes(moving[:ram], slots, slot) - rooms.host)
    if disk and rooms.disk < sizes.file_bytes:
        raise PlanRefusal(f"the model fits nowhere: {disk} layers go to disk, and the layer file needs "
                          f"{gb(sizes.file_bytes)} in {rooms.disk_name}, which has {gb(rooms.disk)} free", "disk",
                          sizes.file_bytes - rooms.disk)
    in_ram = sum(moving[:ram]) if rooms.host is None else 0  # a CPU's RAM is its device
    needed = reserved + on_device + slots * slot + in_ram
    return Placement(sizes.layers, resident, ram, disk, slots, slot, needed, sizes.heads)


def choose_resident(sizes: ModelSizes, device_room: int, slot: int, request: Request) -> int:
    count = len(sizes.layers)
    if request.resident_layers is not None:
        if not 0 <= request.resident_layers <= count:
            raise SpecchatError(f"--resident-layers must be between 0 and {count} (got {request.resident_layers})")
        return request.resident_layers
    if request.tier == "auto" and sum(sizes.layers) <= device_room:
        return count
    return fit(sizes.layers, device_room - MIN_SLOTS * slot, sizes.heads)


def check_resident_fit(on_device: int, resident: int, room: int, rooms: Rooms) -> None:
    """Resident layers asked for (--resident-layers, --offload none), `on_device` bytes, must fit
    beside the smallest ring."""
    if resident and on_device > room:
        raise PlanRefusal(f"{rooms.device_name} is too small for {resident} resident layers: they need "
                          f"{gb(on_device)}, and {gb(max(room, 0))} are left beside the fixed parts, "
                          "caches and ring", "device", on_device - room,
                          "lower --resident-layers or use --offload auto")


def choose_slots(request: Request, streamed: int, device_left: int, slot: int, rooms: Rooms) -> int:
    """The ring: as asked, else every slot the room left holds, up to a whole pass."""
    smallest = min(MIN_SLOTS, streamed)
    slots = min(request.slots, streamed) if request.slots is not None else min(streamed, max(device_left, 0) // slot)
    if slots < smallest or slots * slot > device_left:
        wanted = max(slots, smallest)
        raise PlanRefusal(f"{rooms.device_name} is too small for the streaming ring: {wanted} slots of "
                          f"{gb(slot)} need {gb(wanted * slot)}, {gb(max(device_left, 0))} are left", "device",
                          wanted * slot - device_left)
    return slots


def choose_ram(layers: tuple[int, ...], host_left: int, staging: int, request: Request, rooms: Rooms) -> int:
    """How many streamed layers (from the first in compute order) go to RAM, pinned beside a GPU (on a
    CPU, whose RAM is its device, only under --offload ram); the rest go to disk."""
    if request.tier == "disk":
        return 0
    if request.tier == "ram":
        needed = sum(layers) if rooms.host is None else pinned_tier_bytes(layers)
        if needed > host_left:
            raise PlanRefusal(f"--offload ram: the {len(layers)} streamed layers need {gb(needed)}, and "
                              f"{rooms.host_name} has {gb(max(host_left, 0))} left", "device" if rooms.host is None
                              else "host", needed - host_left)
        return len(layers)
    if pinned_tier_bytes(layers) <= host_left:
        return len(layers)
    # disk reads land in pinned staging, one buffer per slot; the tier's bytes grow with its layers,
    # so the first prefix that does not fit ends the search
    room, count = host_left - staging, 0
    while count < len(layers) and pinned_tier_bytes(layers[:count + 1]) <= room:
        count += 1
    return count


def host_bytes(ram_layers: tuple[int, ...], staging_slots: int, slot: int) -> int:
    """Pinned RAM beside a GPU: the RAM tier's layers and the disk reads' staging, as allocated."""
    return pinned_tier_bytes(ram_layers) + staging_slots * pinned_bytes(slot)
