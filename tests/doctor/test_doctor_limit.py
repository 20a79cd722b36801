"""`specchat doctor`'s smallest memory limit: the least limit at which the pair's own plan fits,
found by bisection over that plan (so at one step less it does not), checked against the pair
planned afresh under that limit and a step below, and against the configs' arithmetic."""

from pathlib import Path

import pytest
from helpers.plan_sizes import TARGET_SLOT, int8_draft, pair_on_a_cpu

import specchat.doctor.limit as limit_module
import specchat.plan.pair as pair_module
from specchat.doctor.limit import LIMIT_STEP, Limit, fits, measure_for_limits, measure_limit, smallest_limit
from specchat.doctor.plan import doctor_options, doctor_request
from specchat.doctor.report import limit_lines
from specchat.errors import PlanRefusal
from specchat.limits import DEFAULT_DRAFT_VOCAB, SMALLEST_AUTO_TREE
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.plan.budget import SMALLEST_CONTEXT, MemoryPlan
from specchat.plan.machine import PAGE_CACHE_SHARE, Machine
from specchat.plan.pair import plan_pair
from specchat.plan.placement import Rooms

GB = 10**9
RUNTIME = 6 * 10**8  # what a process holds after importing torch and transformers (0.55 GB measured)


@pytest.mark.parametrize("threshold", [GB, 1_234_567_891, 7 * GB + 1])
def test_the_bisection_finds_the_least_fitting_step(threshold):
    """A plan that fits under a limit of `threshold` bytes or more: the answer is the first step
    that reaches it."""
    found = smallest_limit(lambda limit: limit >= threshold, RUNTIME)
    assert found % LIMIT_STEP == 0
    assert found >= threshold > found - LIMIT_STEP


def test_the_answer_is_a_step_of_0_05_gb_and_nothing_past_a_tebibyte_is_small():
    assert smallest_limit(lambda limit: limit >= 1_234_567_891, RUNTIME) == 1_250_000_000
    found = smallest_limit(lambda limit: limit >= 2**40, RUNTIME)  # the largest is not a whole step
    assert found % LIMIT_STEP == 0 and found - LIMIT_STEP < 2**40 <= found
    assert smallest_limit(lambda limit: limit > 2**40, RUNTIME) is None


def test_the_limit_is_planned_for_the_cpu_even_beside_a_gpu(monkeypatch, tmp_path: Path):
    """A container limit bounds host memory: the pair is measured as `run` plans it on the CPU,
    whatever GPU torch sees here."""
    devices = []
    monkeypatch.setattr(limit_module, "measure_pair", lambda pair, request, device: devices.append(device))
    monkeypatch.setattr("specchat.plan.machine.cuda_usable", lambda: True)
    measure_for_limits(doctor_options(DEFAULT_TARGET, DEFAULT_DRAFT, None, tmp_path))
    assert [device.type for device in devices] == ["cpu"]


def test_the_room_under_a_limit_is_what_run_measures_under_it(monkeypatch):
    """The plan `fits` weighs has the room `run` would measure under that cgroup limit: the limit
    less the runtime, less PAGE_CACHE_SHARE of the limit for the page cache."""
    seen = []
    monkeypatch.setattr(limit_module, "plan_measured", lambda measured, machine: seen.append(machine.rooms.device))
    assert fits(None, 4 * GB, RUNTIME)
    assert seen == [4 * GB - RUNTIME - int(PAGE_CACHE_SHARE * 4 * GB)] == [2_800_000_000]


def test_a_refused_plan_does_not_fit(monkeypatch):
    def refuse(measured, machine):
        raise PlanRefusal("RAM is short", "device", GB)

    monkeypatch.setattr(limit_module, "plan_measured", refuse)
    assert fits(None, 4 * GB, RUNTIME) is False


def test_a_pair_that_fits_nowhere_has_no_limit():
    assert smallest_limit(lambda limit: False, RUNTIME) is None
    assert "fits under no memory limit" in limit_lines(Limit(None, RUNTIME))[1]


def room_under(limit: int, runtime: int) -> int:
    """The RAM `run` measures under a cgroup `limit` with `runtime` bytes held: the limit less the
    runtime, less PAGE_CACHE_SHARE of the limit kept for the page cache."""
    return limit - runtime - int(PAGE_CACHE_SHARE * limit)


def plan_afresh(limit: int, runtime: int, directory: Path) -> MemoryPlan:
    """The default pair planned from its names, as doctor asks `run` to plan it, on a CPU with
    `room_under` the limit (and a disk with room for any layer file)."""
    machine = Machine(rooms=Rooms(room_under(limit, runtime), None, 2**62, f"RAM under {limit}", disk_name="the disk"))
    return plan_pair(*doctor_request(doctor_options(DEFAULT_TARGET, DEFAULT_DRAFT, None, directory), machine), machine)


def test_the_default_pair_plans_afresh_at_its_limit_and_not_a_step_below(tmp_path: Path):
    """On the real plan (from the configs, or the converted models when they are here): planned
    from scratch under the limit found, the pair fits, streaming layers; a step below it is refused."""
    found = default_pair_limit(None, tmp_path)
    assert plan_afresh(found, RUNTIME, tmp_path).placement.streamed
    with pytest.raises(PlanRefusal):
        plan_afresh(found - LIMIT_STEP, RUNTIME, tmp_path)
    line = limit_lines(Limit(found, RUNTIME))[1]
    assert f"{found / GB:.2f} GB" in line and "docker run --memory" in line


def test_the_limit_of_the_pair_sized_from_its_configs_is_the_first_step_holding_its_least_plan(monkeypatch,
                                                                                               tmp_path: Path):
    """Sized from the configs (whatever converted models are here): the least the pair runs in is
    the smallest context (1024 tokens), the smallest tree (128 tokens and the root), the int8 draft
    with its head over the default sub-vocabulary, no resident layer and a ring of two; the limit
    is the first step whose room holds that, and the step below's does not."""
    monkeypatch.setattr(pair_module, "local_safetensors", lambda source, weights: None)
    least = pair_on_a_cpu(SMALLEST_CONTEXT, SMALLEST_AUTO_TREE + 1, int8_draft(DEFAULT_DRAFT_VOCAB), 2 * TARGET_SLOT)
    found = default_pair_limit(None, tmp_path)  # 2.85 GB: (1.79 GB + the runtime's 0.6 GB) / 0.85, in steps
    assert room_under(found - LIMIT_STEP, RUNTIME) < least <= room_under(found, RUNTIME)


def test_a_smaller_context_needs_a_smaller_limit(tmp_path: Path):
    assert default_pair_limit(1024, tmp_path) < default_pair_limit(8192, tmp_path)


def default_pair_limit(context: int | None, directory: Path) -> int | None:
    measured = measure_for_limits(doctor_options(DEFAULT_TARGET, DEFAULT_DRAFT, context, directory))
    return smallest_limit(lambda limit: fits(measured, limit, RUNTIME), RUNTIME)


def test_the_pair_is_measured_once_and_planned_under_every_limit_tried(monkeypatch, tmp_path: Path):
    """Building the skeletons is what a plan costs (a 235B MoE's took ~33 s a plan on the AMX Xeon,
    and the bisection tries ~16 limits): measure_limit builds them once and plans that measurement
    under each limit: the limit it finds is one the pair planned afresh fits under, a step above
    one it is refused under."""
    measured, planned = [], []
    measure, plan = limit_module.measure_pair, limit_module.plan_measured
    monkeypatch.setattr(limit_module, "measure_pair", lambda *args: measured.append(args) or measure(*args))
    monkeypatch.setattr(limit_module, "plan_measured", lambda *args: planned.append(args) or plan(*args))
    limit = measure_limit(doctor_options(DEFAULT_TARGET, DEFAULT_DRAFT, None, tmp_path))
    assert len(measured) == 1 and len(planned) >= 10
    assert plan_afresh(limit.smallest, limit.runtime, tmp_path).placement.streamed
    with pytest.raises(PlanRefusal):
        plan_afresh(limit.smallest - LIMIT_STEP, limit.runtime, tmp_path)
