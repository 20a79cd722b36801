"""The running estimates themselves: what a record with no predicted time does, and the drafting
memory's means."""

import pytest

from specchat.decoding.calibration import DECAY, DraftingMemory, Ratio


def test_an_iteration_predicted_to_take_no_time_is_not_recorded():
    ratio = Ratio.starting_at(1.0)
    ratio.record_time(predicted_s=0.0, observed_s=0.3)  # nothing to weigh it against: no record, no error
    assert (ratio.observed, ratio.predicted) == (2.0, 2.0)
    ratio.record_time(predicted_s=0.5, observed_s=1.0)  # one record of ratio 2, whatever its seconds
    assert ratio.value == pytest.approx((2.0 * DECAY + 2.0) / (2.0 * DECAY + 1.0))


def test_the_drafting_memory_means_are_per_iteration_from_the_first_record():
    memory = DraftingMemory()
    memory.record(tokens=4, seconds=0.5)
    assert (memory.mean_tokens, memory.mean_seconds, memory.rate) == (4.0, 0.5, 8.0)
    memory.record(tokens=2, seconds=0.5)
    assert memory.mean_tokens == pytest.approx((4 * DECAY + 2) / (DECAY + 1))
    assert memory.mean_seconds == pytest.approx(0.5)
