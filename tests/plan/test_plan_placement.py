"""plan/placement.py at its edges: each room exactly what it must hold is enough, and a byte less
is not (the tiers' ordinary cases are in tests/offload/test_placement.py)."""

import pytest
from helpers.placements import COUNT, LAYER, RESERVED, SIZES, tiers

from specchat.errors import PlanRefusal, SpecchatError
from specchat.offload.direct_io import align_up
from specchat.offload.pinned_chunks import pinned_bytes, pinned_tier_bytes
from specchat.plan.placement import ModelSizes, Request, Rooms, place


def test_a_device_of_exactly_the_fixed_parts_holds_them_and_then_lacks_the_ring():
    rooms = Rooms(device=RESERVED, host=None, disk=10**12)
    with pytest.raises(SpecchatError, match="^RAM is too small for the streaming ring: 2 slots"):
        place(SIZES, rooms)


def test_room_for_one_layer_beside_the_ring_keeps_one_resident():
    assert tiers(place(SIZES, Rooms(device=RESERVED + 3 * LAYER, host=None, disk=10**12))) == (1, 0, COUNT - 1, 2)


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


@pytest.mark.parametrize(("rooms", "request_", "tier"), [
    (Rooms(device=RESERVED - 1, host=None, disk=10**12), Request(), "device"),  # the fixed parts
    (Rooms(device=RESERVED + 2 * LAYER - 1, host=None, disk=10**12), Request(), "device"),  # the ring
    (Rooms(device=RESERVED + 10 * LAYER - 1, host=None, disk=10**12), Request(tier="ram", resident_layers=2),
     "device"),  # a CPU's ram tier
    (Rooms(device=RESERVED + 7 * LAYER - 1, host=None, disk=10**12), Request(resident_layers=5), "device"),  # +ring
    (Rooms(device=RESERVED + 4 * LAYER, host=2 * pinned_bytes(LAYER) - 1, disk=10**12), Request(), "host"),  # staging
    (Rooms(device=RESERVED + 4 * LAYER, host=pinned_tier_bytes((LAYER,) * 6) - 1, disk=10**12), Request(tier="ram"),
     "host"),  # a GPU's ram tier, pinned
    (Rooms(device=RESERVED + 2 * LAYER, host=None, disk=SIZES.file_bytes - 1), Request(), "disk"),  # the layer file
])
def test_a_refusal_a_byte_short_says_which_room_and_one_byte(rooms, request_, tier):
    with pytest.raises(PlanRefusal) as refused:
        place(SIZES, rooms, request_)
    assert (refused.value.tier, refused.value.missing) == (tier, 1)


LAYER_70B = align_up(445_000_000)  # a Llama-2-70B-GPTQ layer: pinned, 512 MiB
SIZES_70B = ModelSizes(layers=(LAYER_70B,) * 80, fixed=0, headroom=0, file_bytes=80 * LAYER_70B)


def test_the_ring_refusal_names_its_slots_bytes_and_what_is_left():
    with pytest.raises(PlanRefusal, match=r"^RAM is too small for the streaming ring: 2 slots of 0\.45 GB need "
                                          r"0\.89 GB, 0\.67 GB are left$"):
        place(SIZES_70B, Rooms(device=LAYER_70B * 3 // 2, host=None, disk=10**13))


def test_the_staging_refusal_names_its_buffers_as_pinned_a_power_of_two_each():
    with pytest.raises(PlanRefusal, match=r"^RAM is too small for the staging of disk reads: 2 pinned buffers of "
                                          r"0\.45 GB take 1\.07 GB$"):
        place(SIZES_70B, Rooms(device=2 * LAYER_70B, host=2**30 - 1, disk=10**13))


def test_asked_resident_layers_a_byte_short_of_room_beside_the_smallest_ring_are_refused_as_such():
    """--resident-layers 5 of 8 needs 5 layers and a 2-slot ring beside the fixed parts: a byte
    less, and the refusal names the resident layers and the options that would fit, not the ring."""
    rooms = Rooms(device=RESERVED + 7 * LAYER - 1, host=None, disk=10**12)
    with pytest.raises(PlanRefusal, match=r"^RAM is too small for 5 resident layers: .*; lower --resident-layers or "
                                          r"use --offload auto$") as refused:
        place(SIZES, rooms, Request(resident_layers=5))
    assert (refused.value.tier, refused.value.missing) == ("device", 1)
    assert tiers(place(SIZES, Rooms(device=RESERVED + 7 * LAYER, host=None, disk=10**12),
                       Request(resident_layers=5))) == (5, 0, 3, 2)


def test_a_ring_slot_holds_the_largest_layer():
    """Layers of different sizes (a model's dense first layers before its MoE ones): every
    streamed layer passes through every slot, so a slot is the largest layer's, aligned."""
    layers = (LAYER, 3 * LAYER + 1, 2 * LAYER)
    sizes = ModelSizes(layers=layers, fixed=1000, headroom=5000, file_bytes=sum(align_up(size) for size in layers))
    placement = place(sizes, Rooms(device=RESERVED + 10 * LAYER, host=None, disk=10**12), Request(resident_layers=0))
    assert placement.slot_bytes == align_up(3 * LAYER + 1) > 3 * LAYER
    assert placement.needed == RESERVED + placement.slots * placement.slot_bytes  # a ring of such slots


def test_a_cpus_ram_tier_a_byte_short_beside_the_ring_is_refused_as_the_ram_tier():
    """--offload ram on a CPU keeps the streamed layers in the same RAM as the ring: 2 resident, 6
    in RAM and 2 slots need 10 layers' room beside the fixed parts."""
    with pytest.raises(PlanRefusal, match=r"^--offload ram: the 6 streamed layers need .*, and RAM has .* left$"):
        place(SIZES, Rooms(device=RESERVED + 10 * LAYER - 1, host=None, disk=10**12), Request(tier="ram",
                                                                                            resident_layers=2))


def test_a_gpu_under_offload_disk_stages_every_streamed_layer_from_the_disk_whatever_ram_it_has():
    rooms = Rooms(device=RESERVED + 4 * LAYER, host=10**12, disk=10**12)
    assert tiers(place(SIZES, rooms, Request(tier="disk"))) == (2, 0, 6, 2)
    assert tiers(place(SIZES, rooms)) == (2, 6, 0, 2)  # auto: all six in pinned RAM
