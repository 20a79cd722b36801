"""Placing decoder layers: into the fastest tier with room, the resident ones spread among the
streamed, the ring sized by what is left, and a one-line error when something does not fit (pure
arithmetic, no model)."""

import pytest
from helpers.placements import COUNT, LAYER, RESERVED, SIZES, tiers

from specchat.errors import SpecchatError
from specchat.offload.placement import Placement, resident_indices, streamed_indices
from specchat.offload.pinned_chunks import pinned_bytes
from specchat.plan.placement import MIN_SLOTS, ModelSizes, Request, Rooms, place

DISK = 10**12
PINNED = 2**17  # LAYER pinned beside a GPU: the allocator rounds 102,400 bytes up to 131,072


def cpu(ram: int, disk: int = DISK) -> Rooms:
    return Rooms(device=ram, host=None, disk=disk, device_name="RAM under --ram-budget")


def test_a_model_that_fits_is_all_resident_and_nothing_streams():
    placement = place(SIZES, cpu(RESERVED + COUNT * LAYER))
    assert tiers(placement) == (COUNT, 0, 0, 0)
    assert placement.streamed == () and placement.pass_bytes == 0
    assert placement.needed == RESERVED + COUNT * LAYER


def test_on_a_cpu_what_is_not_resident_goes_to_disk_beside_the_smallest_ring():
    # room for 5 layers: a ring of two slots comes first, then 3 resident layers
    placement = place(SIZES, cpu(RESERVED + 5 * LAYER + LAYER // 2))
    assert tiers(placement) == (3, 0, 5, MIN_SLOTS)
    # the resident layers spread among the streamed (offload/placement.py): 2, 5 and 7
    assert placement.resident_layers == (2, 5, 7) and placement.resident_bytes == 3 * LAYER
    assert placement.streamed == (0, 1, 3, 4, 6) and placement.disk_layers == placement.streamed
    assert placement.pass_bytes == 5 * LAYER
    assert placement.needed == RESERVED + 3 * LAYER + 2 * LAYER


def test_a_budget_for_the_ring_alone_puts_every_layer_on_disk():
    assert tiers(place(SIZES, cpu(RESERVED + 2 * LAYER))) == (0, 0, COUNT, 2)


def test_a_budget_too_small_for_the_ring_is_one_line():
    with pytest.raises(SpecchatError) as raised:
        place(SIZES, cpu(RESERVED + 2 * LAYER - 1))
    assert str(raised.value) == ("RAM under --ram-budget is too small for the streaming ring: 2 slots of 0.00 GB "
                                 "need 0.00 GB, 0.00 GB are left")


def test_a_budget_too_small_for_the_fixed_parts_is_one_line():
    with pytest.raises(SpecchatError, match=r"^RAM under --ram-budget is too small for the model: its embeddings, "
                                            r"LM head, KV caches and largest tree need 0\.00 GB$"):
        place(SIZES, cpu(RESERVED - 1))


def test_a_model_that_fits_nowhere_is_an_error_naming_the_disk():
    with pytest.raises(SpecchatError, match=r"^the model fits nowhere: 8 layers go to disk, and the layer file "
                                            r"needs 0\.00 GB in the offload directory, which has 0\.00 GB free$"):
        place(SIZES, cpu(RESERVED + 2 * LAYER, disk=COUNT * LAYER - 1))


def test_an_explicit_disk_tier_stages_a_whole_pass_when_ram_allows():
    placement = place(SIZES, cpu(10**12), Request(tier="disk", resident_layers=0))
    assert tiers(placement) == (0, 0, COUNT, COUNT)
    assert "stages a whole pass" in placement.describe()


def test_an_explicit_disk_tier_stages_what_the_budget_leaves():
    placement = place(SIZES, cpu(RESERVED + 2 * LAYER + 5 * LAYER + 7), Request(tier="disk", resident_layers=2))
    assert tiers(placement) == (2, 0, 6, 5)
    assert "stages 5 of 6 layers" in placement.describe()


def test_explicit_slots_and_resident_layers_are_honoured_and_checked():
    assert tiers(place(SIZES, cpu(10**12), Request(tier="disk", resident_layers=5, slots=2))) == (5, 0, 3, 2)
    assert tiers(place(SIZES, cpu(10**12), Request(tier="auto", resident_layers=6))) == (6, 0, 2, 2)
    with pytest.raises(SpecchatError, match=r"^--resident-layers must be between 0 and 8 \(got 9\)$"):
        place(SIZES, cpu(10**12), Request(resident_layers=9))
    with pytest.raises(SpecchatError, match="too small for the streaming ring: 4 slots"):
        place(SIZES, cpu(RESERVED + 3 * LAYER), Request(tier="disk", resident_layers=0, slots=4))


def test_the_ram_tier_on_a_cpu_counts_its_layers_in_the_same_ram():
    placement = place(SIZES, cpu(RESERVED + 10 * LAYER), Request(tier="ram", resident_layers=2))
    assert tiers(placement) == (2, 6, 0, 2) and placement.needed == RESERVED + 10 * LAYER
    with pytest.raises(SpecchatError, match=r"^--offload ram: the 6 streamed layers need 0\.00 GB, and RAM has "):
        place(SIZES, cpu(RESERVED + 8 * LAYER), Request(tier="ram", resident_layers=2))  # no room left for the ring

def test_a_gpu_fills_its_memory_then_pinned_ram_then_disk():
    rooms = Rooms(device=RESERVED + 4 * LAYER, host=3 * PINNED + PINNED // 2, disk=DISK)
    placement = place(SIZES, rooms)
    # the GPU: 2 slots + 2 layers; pinned RAM: 2 layers + 2 staging buffers for disk reads would not
    # fit with 3 (each pinned as its power of two), so 1 layer + the staging; the rest on disk
    assert tiers(placement) == (2, 1, 5, 2)
    assert placement.resident_layers == (3, 7)  # spread among the streamed
    assert placement.ram_layers == (0,) and placement.disk_layers == (1, 2, 4, 5, 6)


def test_a_gpu_with_ram_for_every_streamed_layer_needs_no_disk():
    rooms = Rooms(device=RESERVED + 4 * LAYER, host=6 * PINNED, disk=0)
    assert tiers(place(SIZES, rooms)) == (2, 6, 0, 2)
    with pytest.raises(SpecchatError, match="the model fits nowhere"):  # 6 layers' bytes, but not as pinned
        place(SIZES, Rooms(device=RESERVED + 4 * LAYER, host=6 * LAYER, disk=0))


def test_pinned_ram_too_small_for_the_disk_reads_staging_is_one_line():
    rooms = Rooms(device=RESERVED + 4 * LAYER, host=PINNED, disk=DISK)  # 2 staging buffers of PINNED each
    with pytest.raises(SpecchatError, match=r"^RAM is too small for the staging of disk reads: 2 pinned buffers"):
        place(SIZES, rooms)


def test_pinned_allocations_round_up_to_a_power_of_two():
    assert pinned_bytes(LAYER) == PINNED and pinned_bytes(PINNED) == PINNED and pinned_bytes(PINNED + 1) == 2 * PINNED
    assert pinned_bytes(445_000_000) == 512 * 2**20 and pinned_bytes(634_000_000) == 2**30  # the 70B / 13B layers


def test_resident_layers_asked_for_must_fit():
    with pytest.raises(SpecchatError, match=r"^RAM under --ram-budget is too small for 5 resident layers"):
        place(SIZES, cpu(RESERVED + 6 * LAYER), Request(tier="disk", resident_layers=5))


def test_the_expected_pass_time_comes_from_the_link_speeds():
    placement = Placement((LAYER,) * 4, resident=1, ram=1, disk=2, slots=2, slot_bytes=LAYER, needed=0)
    assert placement.expected_pass_s(ram_gbps=LAYER / 1e9, disk_gbps=2 * LAYER / 1e9) == pytest.approx(2.0)
    assert placement.expected_pass_s(ram_gbps=None, disk_gbps=1.0) is None
    line = placement.describe(ram_gbps=LAYER / 1e9, disk_gbps=2 * LAYER / 1e9)
    assert line == ("4 decoder layers: 1 resident, 1 in RAM, 2 on disk; ring of 2 slots (stages 2 of 3 layers); "
                    "0.00 GB streamed per pass, ~2.00 s per pass at 0.00 GB/s from RAM and 0.00 GB/s from disk")


@pytest.mark.parametrize("count", [1, 5, 8, 28, 80])
def test_streamed_layers_spread_evenly_from_the_first_and_the_resident_ones_are_the_rest(count):
    for resident in range(count + 1):
        moving, staying = streamed_indices(count, resident), resident_indices(count, resident)
        assert list(moving) == sorted(set(moving)) and len(moving) == count - resident and moving[:1] in ((), (0,))
        assert sorted(set(moving) | set(staying)) == list(range(count)) and not set(moving) & set(staying)
        if moving:
            gaps = [after - before - 1 for before, after in zip(moving, moving[1:] + (count + moving[0],))]
            assert max(gaps) - min(gaps) <= 1  # as many resident layers between any two streamed ones, within one
    assert streamed_indices(8, 3) == (0, 1, 3, 4, 6) and resident_indices(8, 3) == (2, 5, 7)
    assert resident_indices(count, count) == tuple(range(count)) and resident_indices(count, 0) == ()


def test_a_moe_model_streamed_by_expert_keeps_its_first_layers_and_streams_the_last():
    """Its MoE layers move the experts a pass routes to, its dense ones (first, where it has both)
    all their bytes: the last layers stream, as an upcycled model's three MoE layers must."""
    assert streamed_indices(8, 3, by_expert=True) == (3, 4, 5, 6, 7)
    assert resident_indices(8, 3, by_expert=True) == (0, 1, 2)
    moe = ModelSizes(layers=(LAYER,) * COUNT, fixed=1000, headroom=5000, file_bytes=COUNT * LAYER,
                     heads=(LAYER // 5,) * COUNT)
    placement = place(moe, cpu(RESERVED + 5 * LAYER + LAYER // 2))
    assert placement.resident_layers == (0, 1, 2) and placement.streamed == (3, 4, 5, 6, 7)


def test_layers_of_uneven_sizes_keep_on_the_device_the_most_that_fit_where_they_are_placed():
    """A model whose layers differ (a GGUF's Q6_K layers among Q4_K ones): the resident count is
    the largest whose spread layers fit beside the ring, counted by their own sizes."""
    layers = tuple(LAYER * (2 if index % 2 else 1) for index in range(COUNT))  # odd layers twice the size
    sizes = ModelSizes(layers=layers, fixed=1000, headroom=5000, file_bytes=sum(layers))
    slot = 2 * LAYER
    placement = place(sizes, cpu(RESERVED + 2 * slot + 4 * LAYER))
    kept = placement.resident_layers
    assert placement.resident_bytes == sum(layers[index] for index in kept) <= 4 * LAYER
    assert sum(layers[index] for index in resident_indices(COUNT, len(kept) + 1)) > 4 * LAYER
    assert placement.needed == RESERVED + placement.resident_bytes + placement.slots * slot
