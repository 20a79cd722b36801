"""The small model the placement tests place (tests/offload/test_placement.py, tests/plan/
test_plan_placement.py): eight equal layers, each already aligned, so that a ring slot is one layer."""

from specchat.offload.direct_io import ALIGN
from specchat.offload.placement import Placement
from specchat.plan.placement import ModelSizes

LAYER = 25 * ALIGN  # every layer the same size, already aligned: slot == LAYER
COUNT = 8
SIZES = ModelSizes(layers=(LAYER,) * COUNT, fixed=1000, headroom=5000, file_bytes=COUNT * LAYER)
RESERVED = SIZES.fixed + SIZES.headroom


def tiers(placement: Placement) -> tuple[int, int, int, int]:
    """Resident layers, those in RAM, those on disk, and the ring's slots."""
    return placement.resident, placement.ram, placement.disk, placement.slots
