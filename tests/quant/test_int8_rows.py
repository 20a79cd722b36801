"""The widths up to which int8 pays (quant/widths.py's int8 crossover): the choice made from the
timer's verdicts, not the clock."""

import pytest
import torch

from specchat.quant import timing
from specchat.quant.widths import INT8_ROWS, int8_rows, measure_int8_rows


def test_int8_never_pays_without_a_kernel_for_the_dtype():
    assert int8_rows(torch.float64) == 0


@pytest.mark.parametrize("wins_up_to", [0, 1, 4, 64])
def test_int8_rows_is_the_widest_input_up_to_which_int8_always_wins(monkeypatch, wins_up_to):
    """The choice, not the clock: a stand-in for the timer that lets int8 (the first product timed)
    win at the widths of INT8_ROWS up to `wins_up_to`, and at 32 rows past a loss."""
    timed = []

    def stand_in(first, second, device) -> bool:
        first(), second()  # both banks run (a bank of linears returns nothing)
        timed.append(device)
        rows = INT8_ROWS[len(timed) - 1]
        return rows <= wins_up_to or rows == 32  # a win past a loss does not count

    monkeypatch.setattr(timing, "faster", stand_in)
    assert measure_int8_rows(torch.bfloat16) == wins_up_to
    assert set(timed) == {torch.device("cpu")}  # int8's dynamic kernel is a CPU's
