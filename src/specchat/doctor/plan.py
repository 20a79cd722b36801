"""What a run of a target and its draft would hold, tier by tier, on this machine or on one
described by its sizes, and the speed the paper's generation rates give it: from the models'
configs alone (shipped with the aliases), nothing downloaded, converted or loaded."""

from dataclasses import dataclass
from pathlib import Path

import torch

from specchat.errors import SpecchatError
from specchat.limits import DEFAULT_DRAFT_VOCAB, auto_cap, auto_trees
from specchat.models.loading import has_int4, resolve
from specchat.models.plan import draft_candidates, draft_kinds, plan_target
from specchat.offload.budget import MemoryPlan, described_rooms
from specchat.offload.build import OffloadPlan
from specchat.offload.placement import Rooms, link_speeds
from specchat.transfer import gb_to_bytes

# Tokens accepted per target pass that SpecExec reports for 70B targets offloaded beside 7B drafts
# at budgets of 1-2k tokens (Svirschevski et al. 2024): the range the expected speed spans.
PAPER_GEN_RATES = (8.0, 20.0)


@dataclass(frozen=True)
class Machine:
    """Where to plan: this machine (measured), or one described by its sizes (GB = 1e9 bytes)."""

    vram_gb: float | None = None  # a described GPU's memory; None with ram_gb: a CPU-only machine
    ram_gb: float | None = None  # None: this machine
    disk_gbps: float | None = None
    pcie_gbps: float | None = None

    @property
    def described(self) -> bool:
        return self.ram_gb is not None or self.vram_gb is not None


@dataclass(frozen=True)
class PairPlan:
    memory: MemoryPlan
    pass_s: float | None  # seconds one pass streams; None when a link speed is unknown or nothing streams
    tokens_per_s: tuple[float, float] | None  # at PAPER_GEN_RATES, when pass_s is known


def plan_pair(target: str, draft: str | None, context: int | None, machine: Machine, offload_dir: Path,
              ram_budget: int | None = None, vram_budget: int | None = None, rooms: Rooms | None = None) -> PairPlan:
    """The plan of `target` (and `draft`, its head scoring the default sub-vocabulary) in bfloat16
    with --offload auto and --weights auto, as `run` would make it; in `rooms` (a CPU's) when given."""
    if machine.described and machine.ram_gb is None:
        raise SpecchatError("--vram-gb describes a GPU machine: give its RAM with --ram-gb too")
    cuda = machine.vram_gb is not None if machine.described else torch.cuda.is_available() and rooms is None
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16
    kinds = ("none", "nf4") if cuda and machine.described else draft_kinds("auto", device, None if cuda else "int8")
    drafts = (None,) if draft is None else draft_candidates(draft, dtype, kinds, None, DEFAULT_DRAFT_VOCAB or None,
                                                            device)
    trees = auto_trees(auto_cap(cuda=cuda, offloaded=True))
    plan = OffloadPlan(tier="auto", offload_dir=offload_dir, ram_budget=ram_budget, vram_budget=vram_budget,
                       tree_tokens=trees[0], smaller_trees=trees[1:], drafts=drafts,
                       dense_copies=not cuda and not machine.described)
    if machine.described:
        rooms = described_rooms(gb_to_bytes(machine.vram_gb), gb_to_bytes(machine.ram_gb))
    memory = plan_target(target, dtype, device, plan, context, rooms, int4=has_int4(resolve(target)))
    link = machine.pcie_gbps if cuda else None
    pass_s = memory.placement.expected_pass_s(link, machine.disk_gbps) if memory.placement.streamed else None
    rates = None if pass_s is None else tuple(rate / pass_s for rate in PAPER_GEN_RATES)
    return PairPlan(memory, pass_s, rates)


def pass_timing(pair: PairPlan, ram_gbps: float | None, disk_gbps: float | None) -> str:
    """How long the plan's streaming takes a pass, at which links' speeds."""
    placement = pair.memory.placement
    if not placement.streamed:
        return "no streaming: compute speed"
    if pair.pass_s is None:
        return "unknown (no measured or given link speed: --pcie-gbps, --disk-gbps)"
    return f"~{pair.pass_s:.2f} s streaming per pass at {link_speeds(placement, ram_gbps, disk_gbps)}"
