"""Where the plan puts the target's weights (an offload tier) and how large a draft tree pays there."""

from dataclasses import dataclass

from specchat.doctor.plan import PairPlan, pass_timing
from specchat.limits import default_budget
from specchat.transfer import gb


@dataclass(frozen=True)
class Recommendation:
    tier: str  # none | ram | disk
    budget: int  # draft tree size K
    reason: str


def advise(pair: PairPlan, cuda: bool, ram_gbps: float | None, disk_gbps: float | None) -> Recommendation:
    """The tier `pair`'s plan streams the target's layers from (none when every layer is resident)
    and the budget the engines default to there (`specchat.limits.default_budget`): in memory small
    trees pay on a CPU, large ones on a GPU; offloaded, a target pass costs the time to stream its
    layers, nearly flat in tree size, so large trees pay."""
    memory, placement = pair.memory, pair.memory.placement
    weights = f"the weights ({gb(memory.target_bytes())})"
    room = memory.rooms.device_name
    if not placement.streamed:
        why = "a GPU scores hundreds of tokens for the price of a few" if cuda else "on a CPU small trees pay"
        return Recommendation("none", default_budget(cuda, offloaded=False), f"{weights} fit in {room}; {why}")
    kept = f"{placement.resident} of their {len(placement.layers)} decoder layers fit in {room}"
    return Recommendation("disk" if placement.disk else "ram", default_budget(cuda, offloaded=True),
                          f"{weights} do not: {kept}; each target pass streams {gb(placement.pass_bytes)}, "
                          f"{pass_timing(pair, ram_gbps, disk_gbps)}, nearly flat in tree size, so a large tree pays")
