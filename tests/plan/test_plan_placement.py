"""plan/placement.py at its edges: each room exactly what it must hold is enough, and a byte less
is not (the tiers' ordinary cases are in tests/offload/test_placement.py)."""

import pytest

from specchat.errors import SpecchatError
from specchat.offload.direct_io import ALIGN
from specchat.offload.pinned_chunks import pinned_bytes, pinned_tier_bytes
from specchat.plan.placement import ModelSizes, Request, Rooms, place

LAYER = 25 * ALIGN  # aligned already: a slot is one layer
COUNT = 8
SIZES = ModelSizes(layers=(LAYER,) * COUNT, fixed=1000, headroom=5000, file_bytes=COUNT * LAYER)
RESERVED = SIZES.fixed + SIZES.headroom


def tiers(placement) -> tuple[int, int, int, int]:
    return placement.resident, placement.ram, placement.disk, placement.slots


def test_a_device_of_exactly_the_fixed_parts_holds_them_and_then_lacks_the_ring():
    rooms = Rooms(device=RESERVED, host=None, disk=10**12)
    with pytest.raises(SpecchatError, match="^RAM is too small for the streaming ring: 2 slots"):
        place(SIZES, rooms)


def test_one_layer_streamed_streams_through_a_one_slot_ring():
    rooms = Rooms(device=RESERVED + COUNT * LAYER, host=None, disk=10**12)
    placement = place(SIZES, rooms, Request(resident_layers=COUNT - 1))
    assert tiers(placement) == (COUNT - 1, 0, 1, 1)
    assert placement.streamed == (0,) and placement.needed == RESERVED + COUNT * LAYER


def test_pinned_ram_of_exactly_the_streamed_layers_tier_takes_them_all():
    device = RESERVED + 4 * LAYER  # 2 resident layers beside 2 slots: 6 stream
    exact = pinned_tier_bytes((LAYER,) * 6)
    placement = place(SIZES, Rooms(device=device, host=exact, disk=0))
    assert tiers(placement) == (2, 6, 0, 2)
    assert placement.needed == device  # on a GPU the pinned tier is the host's, not the device's
    with pytest.raises(SpecchatError, match="the model fits nowhere"):
        place(SIZES, Rooms(device=device, host=exact - 1, disk=0))


def test_pinned_ram_of_exactly_its_layers_and_the_disk_reads_staging_is_enough():
    device = RESERVED + 4 * LAYER
    staging = 2 * pinned_bytes(LAYER)  # one pinned buffer a slot
    exact = pinned_tier_bytes((LAYER,)) + staging
    assert tiers(place(SIZES, Rooms(device=device, host=exact, disk=10**12))) == (2, 1, 5, 2)
    assert tiers(place(SIZES, Rooms(device=device, host=exact - 1, disk=10**12))) == (2, 0, 6, 2)
    with pytest.raises(SpecchatError, match="^RAM is too small for the staging of disk reads"):
        place(SIZES, Rooms(device=device, host=staging - 1, disk=10**12))
    assert tiers(place(SIZES, Rooms(device=device, host=staging, disk=10**12))) == (2, 0, 6, 2)


def test_a_disk_of_exactly_the_layer_file_holds_it():
    rooms = Rooms(device=RESERVED + 2 * LAYER, host=None, disk=SIZES.file_bytes)
    assert tiers(place(SIZES, rooms)) == (0, 0, COUNT, 2)
