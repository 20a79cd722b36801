"""Where the target's weights should live (an offload tier) and how large a draft tree pays."""

from dataclasses import dataclass

from specchat.doctor.facts import Facts
from specchat.limits import default_budget
from specchat.transfer import gb

HEADROOM = 1.2  # weights "fit" when 1.2x their size is free: activations, KV cache, draft, the OS


@dataclass(frozen=True)
class Recommendation:
    tier: str  # none | ram | disk
    budget: int  # draft tree size K
    reason: str


def advise(facts: Facts) -> Recommendation:
    device_free = facts.cuda[0].free if facts.cuda else None  # the engines compute on cuda:0
    return recommend(facts.target_bytes, device_free, facts.ram_available, facts.disk_gbps, facts.h2d_gbps)


def recommend(
    target_bytes: int, device_free: int | None, ram_available: int, disk_gbps: float, h2d_gbps: float | None
) -> Recommendation:
    """Where the target's weights should live and how large a draft tree pays.

    `device_free` is the CUDA device's free memory, None on a CPU (whose memory is the RAM).
    The budget is the one the engines default to there (`specchat.limits.default_budget`): in
    memory small trees pay on a CPU, large ones on a GPU; offloaded, a target pass costs the time
    to stream every weight, nearly flat in tree size, so large trees pay.
    """
    cuda = device_free is not None
    need = target_bytes * HEADROOM
    size = gb(target_bytes)
    if need <= (device_free if cuda else ram_available):
        room = f"GPU memory ({gb(device_free)} free)" if cuda else f"RAM ({gb(ram_available)} available)"
        why = "a GPU scores hundreds of tokens for the price of a few" if cuda else "on a CPU small trees pay"
        reason = f"the weights ({size}) fit in {room} with 20% headroom; {why}"
        return Recommendation("none", default_budget(cuda, offloaded=False), reason)
    if cuda and need <= ram_available:
        tier, source, gbps = "ram", "pinned RAM", h2d_gbps
        missing = f"do not fit in GPU memory ({gb(device_free)} free) but fit in RAM ({gb(ram_available)} available)"
    else:
        tier, source, gbps = "disk", "disk", disk_gbps
        missing = f"do not fit in RAM ({gb(ram_available)} available) with 20% headroom"
    return Recommendation(
        tier,
        default_budget(cuda, offloaded=True),
        f"the weights ({size}) {missing}; {stream_cost(target_bytes, source, gbps)}, "
        "nearly flat in tree size, so a large tree pays",
    )


def stream_cost(target_bytes: int, source: str, gbps: float | None) -> str:
    if gbps is None:
        return f"each target pass streams them from {source}"
    return f"each target pass streams them from {source} at {gbps:.2f} GB/s, ~{target_bytes / (gbps * 1e9):.1f} s"
