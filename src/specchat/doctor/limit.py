"""The smallest memory limit a pair plans to run in on a CPU: what `docker run --memory` (or a
Kubernetes or systemd limit) must give specchat, with every layer that does not fit streamed from
the disk. Found by bisection over the same plan `run` makes (`plan_pair`'s, measured once), on a machine whose
room is what `run` would measure under that limit: the limit less what the process already holds
before it loads any weights (python, torch, transformers and the target's tokenizer: the runtime,
measured in the doctor's own process with the tokenizer loaded, as `run` loads it before it plans)
and less the share of the limit kept for the page cache (plan/machine.py)."""

from collections.abc import Callable
from dataclasses import dataclass

from specchat.doctor.plan import doctor_request
from specchat.errors import PlanRefusal
from specchat.memory_room import Room, process_rss
from specchat.models.local import local_tokenizer
from specchat.plan import (Machine, MeasuredModel, Rooms, kept_for_page_cache, measure_pair, plan_measured,
                          resolve_weights)
from specchat.engine_options import EngineOptions
from specchat.transfer import gb

LIMIT_STEP = 5 * 10**7  # the answer's precision: 0.05 GB
LARGEST_LIMIT = 2**40  # past this nothing is "small"


@dataclass(frozen=True)
class Limit:
    smallest: int | None  # bytes; None: fits under no limit
    runtime: int  # what the process held when planning, included in `smallest`


def measure_limit(options: EngineOptions, slots: int | None = 1) -> Limit:
    """The smallest limit with this process's resident set, the target's tokenizer loaded, as the
    runtime. The pair is measured once (its skeletons are what a plan costs: ~30 s for a 235B MoE
    on a slow CPU), then planned under each limit the bisection tries; `slots` conversations kept
    at once (serve's; auto plans one where memory is short, so its limit is one's)."""
    options = resolve_weights(options)
    tokenizer = local_tokenizer(options.target, options.weights)  # held while the runtime is read
    runtime = process_rss()
    del tokenizer
    measured = measure_for_limits(options, slots)
    return Limit(smallest_limit(lambda limit: fits(measured, limit, runtime), runtime), runtime)


def measure_for_limits(options: EngineOptions, slots: int | None = 1) -> MeasuredModel:
    """The pair as `run` with `options` would plan it on this machine's CPU, whatever memory limit
    it runs under: the request `run` makes, measured once (plan.measure_pair) to be planned under
    each limit (plan.plan_measured)."""
    machine = Machine(kind="cpu")
    return measure_pair(*doctor_request(options, machine, slots), machine.device())


def smallest_limit(fits_under: Callable[[int], bool], runtime: int) -> int | None:
    """The smallest limit, in bytes (a multiple of LIMIT_STEP), under which `fits_under` holds
    with `runtime` bytes already held; None when it holds under no limit (a disk too small, say)."""
    if not fits_under(LARGEST_LIMIT):
        return None
    low, high = runtime // LIMIT_STEP, -(-LARGEST_LIMIT // LIMIT_STEP)  # in steps: low fails, high (rounded up) fits
    while high - low > 1:
        middle = (low + high) // 2
        if fits_under(middle * LIMIT_STEP):
            high = middle
        else:
            low = middle
    return high * LIMIT_STEP


def fits(measured: MeasuredModel, limit: int, runtime: int) -> bool:
    """Whether the measured pair plans under a `limit` of which `runtime` bytes are held, as `run`
    measures a cgroup limit (the page cache's share kept)."""
    room = kept_for_page_cache(Room(limit - runtime, f"a memory limit of {gb(limit)}", limit))
    rooms = Rooms(room.bytes, None, 2**62, room.bound, disk_name="the disk")
    try:
        plan_measured(measured, Machine(rooms=rooms))
    except PlanRefusal:
        return False
    return True
