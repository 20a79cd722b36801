import pytest
import torch
from helpers.suite_scale import (
    HALF,
    SCALE_ENV,
    SLOW_MS,
    decide_scale,
    factor_for,
    product_ms,
    scaled,
    suite_scale,
)


def test_a_slow_product_halves_the_draws_and_a_fast_one_keeps_them():
    assert factor_for(SLOW_MS - 0.1) == 1.0
    assert factor_for(SLOW_MS) == HALF
    assert factor_for(3 * SLOW_MS) == HALF


def test_a_halved_draw_rounds_up_and_never_reaches_zero(monkeypatch):
    monkeypatch.setenv(SCALE_ENV, "0.5")
    assert [scaled(n) for n in (1, 2, 3, 24, 30)] == [1, 1, 2, 12, 15]
    monkeypatch.setenv(SCALE_ENV, "1")
    assert [scaled(n) for n in (1, 2, 3, 24, 30)] == [1, 2, 3, 24, 30]


def test_an_unset_scale_is_full(monkeypatch):
    monkeypatch.delenv(SCALE_ENV, raising=False)
    assert suite_scale() == 1.0


@pytest.mark.parametrize("text", ["0", "1.5", "half", "-1"])
def test_a_scale_outside_0_1_is_refused_in_one_line(monkeypatch, text):
    monkeypatch.setenv(SCALE_ENV, text)
    with pytest.raises(ValueError, match=f"{SCALE_ENV} must be a number in \\(0, 1\\]"):
        suite_scale()


def test_a_set_scale_is_kept_without_measuring(monkeypatch):
    monkeypatch.setenv(SCALE_ENV, "1")
    scale = decide_scale(measure=lambda: pytest.fail("measured although the scale was set"))
    assert (scale.factor, scale.product_ms) == (1.0, None)
    assert SCALE_ENV in scale.describe()


def test_an_unset_scale_is_measured_and_handed_on(monkeypatch):
    monkeypatch.delenv(SCALE_ENV, raising=False)
    scale = decide_scale(measure=lambda: 2 * SLOW_MS)
    assert (scale.factor, scale.product_ms) == (HALF, 2 * SLOW_MS)
    assert suite_scale() == HALF  # what the workers started after this inherit
    assert f"{2 * SLOW_MS:.1f} ms" in scale.describe()


def test_the_product_is_timed_on_one_thread_and_the_threads_restored():
    threads = torch.get_num_threads()
    assert 0 < product_ms() < 10_000
    assert torch.get_num_threads() == threads
