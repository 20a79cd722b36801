"""How many LM-head rows one call of the verification walk holds: batched where eight rows cost
about one, one where each row costs a call (decoding/head_rows.py)."""

import torch

from specchat.decoding import head_rows
from specchat.decoding.head_rows import BATCH_ROWS, PER_ROW_RATIO, measure_head_rows, rows_for


def test_a_head_whose_rows_each_cost_a_call_is_read_a_row_at_a_time():
    assert rows_for(0.0236, 0.1835) == 1  # the 1.5B's bf16 head on an AVX2 AMD EPYC (no bf16 instructions)
    assert rows_for(0.010, 0.010 * PER_ROW_RATIO * 1.01) == 1


def test_a_head_bound_by_its_weights_read_is_read_in_batches():
    assert rows_for(0.011, 0.013) == BATCH_ROWS  # memory-bound: eight rows cost about one
    assert rows_for(0.010, 0.010 * PER_ROW_RATIO) == BATCH_ROWS


def timed_as(seconds: list[float]):
    """A stand-in for the timer: each run called once, `seconds` returned as their times."""
    def best_seconds(runs, device) -> list[float]:
        for run in runs:
            run()
        return seconds
    return best_seconds


def test_the_measurement_times_the_head_over_one_row_and_over_a_batch(monkeypatch):
    seen: list[tuple[int, ...]] = []

    def head(hidden: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(hidden.shape))
        return hidden

    for seconds, expected in (([0.02, 0.16], 1), ([0.02, 0.025], BATCH_ROWS)):
        monkeypatch.setattr(head_rows, "best_seconds", timed_as(seconds))
        seen.clear()
        assert measure_head_rows(head, 16, torch.bfloat16, torch.device("cpu")) == expected
        assert seen == [(1, 16), (BATCH_ROWS, 16)]
