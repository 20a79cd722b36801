"""`specchat doctor`'s smallest memory limit: the least limit at which the pair's own plan fits,
found by bisection over that plan (so at one step less it does not)."""

from pathlib import Path

import pytest

import specchat.doctor.limit as limit_module
from specchat.doctor.limit import LIMIT_STEP, Limit, fits, measure_for_limits, measure_limit, smallest_limit
from specchat.doctor.report import limit_lines
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.plan.machine import PAGE_CACHE_SHARE

GB = 10**9
RUNTIME = 6 * 10**8  # what a process holds after importing torch and transformers (0.55 GB measured)


@pytest.mark.parametrize("threshold", [GB, 1_234_567_891, 7 * GB + 1])
def test_the_bisection_finds_the_least_fitting_step(threshold):
    """A plan that fits under a limit of `threshold` bytes or more: the answer is the first step
    that reaches it."""
    found = smallest_limit(lambda limit: limit >= threshold, RUNTIME)
    assert found % LIMIT_STEP == 0
    assert found >= threshold > found - LIMIT_STEP


def test_the_room_under_a_limit_is_what_run_measures_under_it(monkeypatch):
    """The plan `fits` weighs has the room `run` would measure under that cgroup limit: the limit
    less the runtime, less PAGE_CACHE_SHARE of the limit for the page cache."""
    seen = []
    monkeypatch.setattr(limit_module, "plan_measured", lambda measured, machine: seen.append(machine.rooms.device))
    assert fits(None, 4 * GB, RUNTIME)
    assert seen == [4 * GB - RUNTIME - int(PAGE_CACHE_SHARE * 4 * GB)] == [2_800_000_000]


def test_a_pair_that_fits_nowhere_has_no_limit():
    assert smallest_limit(lambda limit: False, RUNTIME) is None
    assert "fits under no memory limit" in limit_lines(Limit(None, RUNTIME))[1]


def test_the_default_pair_fits_at_its_limit_and_not_a_step_below(tmp_path: Path):
    """On the real plan (from the configs, or the converted models when they are here): streaming
    every layer, the default pair needs more than the runtime and less than its in-memory size."""
    measured = measure_for_limits(DEFAULT_TARGET, DEFAULT_DRAFT, None, tmp_path)
    found = default_pair_limit(None, tmp_path)
    assert RUNTIME + GB // 2 < found < RUNTIME + 8 * GB
    assert fits(measured, found, RUNTIME)
    assert not fits(measured, found - LIMIT_STEP, RUNTIME)
    line = limit_lines(Limit(found, RUNTIME))[1]
    assert f"{found / GB:.2f} GB" in line and "docker run --memory" in line


def test_a_smaller_context_needs_a_smaller_limit(tmp_path: Path):
    assert default_pair_limit(1024, tmp_path) < default_pair_limit(8192, tmp_path)


def default_pair_limit(context: int | None, directory: Path, runtime: int = RUNTIME) -> int | None:
    measured = measure_for_limits(DEFAULT_TARGET, DEFAULT_DRAFT, context, directory)
    return smallest_limit(lambda limit: fits(measured, limit, runtime), runtime)


def test_the_pair_is_measured_once_and_planned_under_every_limit_tried(monkeypatch, tmp_path: Path):
    """Building the skeletons is what a plan costs (a 235B MoE's took ~33 s a plan on the AMX Xeon,
    and the bisection tries ~16 limits): measure_limit builds them once and plans that measurement
    under each limit, finding what planning the pair afresh finds."""
    measured, planned = [], []
    measure, plan = limit_module.measure_pair, limit_module.plan_measured
    monkeypatch.setattr(limit_module, "measure_pair", lambda *args: measured.append(args) or measure(*args))
    monkeypatch.setattr(limit_module, "plan_measured", lambda *args: planned.append(args) or plan(*args))
    limit = measure_limit(DEFAULT_TARGET, DEFAULT_DRAFT, None, tmp_path)
    assert len(measured) == 1 and len(planned) >= 10
    assert limit.smallest == default_pair_limit(None, tmp_path, limit.runtime)
