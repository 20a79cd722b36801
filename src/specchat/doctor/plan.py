"""What a run of a target and its draft would hold, tier by tier, on this machine or on one
described by its sizes, and the speed the paper's generation rates give it: from the models'
configs alone (shipped with the aliases), nothing downloaded, converted or loaded."""

from dataclasses import dataclass
from pathlib import Path

import torch

from specchat.errors import SpecchatError
from specchat.offload.placement import Placement, link_speeds
from specchat.models.configs import read_config
from specchat.plan import (Machine, MemoryPlan, Pair, PlanRequest, drafting_s, expert_share, experts_touched,
                          plan_pair, request_for, shape_of)
from specchat.engine_options import DRAFTED_ENGINES, EngineOptions


@dataclass(frozen=True)
class GenRates:
    """Tokens accepted per target pass that SpecExec reports (Svirschevski et al. 2024), and the
    tree they were measured at: the expected speed is those rates over a pass of that tree."""

    rates: tuple[float, ...]
    tree: int  # tree tokens a pass scores at those rates (its budget and root)
    source: str


# 70B targets offloaded beside 7B drafts at budgets of 1-2k tokens: the range the speed spans.
PAPER_GEN_RATES = GenRates((8.0, 20.0), 1025, "SpecExec's offloaded 70B gen rates")
# Mixtral-8x7B-GPTQ offloaded beside Mistral-7B, budget 256 (Table 1, OASST, t=0.6).
PAPER_MOE_GEN_RATES = GenRates((12.38,), 257, "SpecExec's Mixtral-8x7B gen rate at a 256-token budget")


TREE_SIZES = (1, 16, 64, 1024)  # the tree widths doctor says a MoE pass's routing at


@dataclass(frozen=True)
class PairPlan:
    memory: MemoryPlan
    pass_s: float | None  # seconds one pass over gen_rates' tree streams; None when a link speed is unknown or nothing streams
    tokens_per_s: tuple[float, ...] | None  # at gen_rates, when pass_s is known
    routing: "Routing | None" = None  # a MoE target's experts a pass touches; None: a dense target
    gen_rates: GenRates = PAPER_GEN_RATES

    @property
    def drafting_s(self) -> float | None:
        return tree_drafting_s(self.memory, self.gen_rates)


@dataclass(frozen=True)
class Routing:
    """A MoE target's experts a layer: E, k routed a token, and those a pass over each of
    TREE_SIZES tree tokens touches (plan/experts.py), with the bytes such a pass streams."""

    experts: int
    routed: int
    touched: tuple[float, ...]
    streamed: tuple[float, ...]  # bytes a pass over each of TREE_SIZES streams (0 when nothing streams)


def doctor_options(target: str, draft: str | None, context: int | None, offload_dir: Path,
                   ram_budget: float | None = None, vram_budget: float | None = None) -> EngineOptions:
    """What `run` would be given for the pair: its defaults (bfloat16, --offload auto, --weights
    auto, --draft-quant auto, the draft's head over the default sub-vocabulary) with doctor's
    --context, --offload-dir and budgets (GB); no draft: the autoregressive engine."""
    drafted = {"draft": draft} if draft is not None else {"engine": "autoregressive"}
    return EngineOptions(target=target, context=context, offload_dir=str(offload_dir), ram_budget=ram_budget,
                         vram_budget=vram_budget, **drafted)


def doctor_request(options: EngineOptions, machine: Machine, slots: int | None = 1) -> tuple[Pair, PlanRequest]:
    """What `run` with `options` would ask of `machine`, or `serve --slots` (`slots` conversations
    kept at once; None: auto): the request they make (plan.request_for)."""
    return request_for(options, machine, drafted=options.engine in DRAFTED_ENGINES, conversations=slots)


def doctor_plan(options: EngineOptions, machine: Machine, slots: int | None = 1) -> PairPlan:
    """The plan of `options`' pair as `run` (or `serve --slots`) would make it on `machine`; with the
    time its streaming takes a pass and the speed the paper's generation rates give it over that
    pass and, where the draft's step was timed on this machine, a full tree's drafting."""
    if machine.described and machine.ram_gb is None:
        raise SpecchatError("--vram-gb describes a GPU machine: give its RAM with --ram-gb too")
    cuda = machine.device().type == "cuda"
    memory = plan_pair(*doctor_request(options, machine, slots), machine)
    placement = memory.placement
    routing = routing_of(options.target, placement)
    gen = PAPER_GEN_RATES if routing is None else PAPER_MOE_GEN_RATES
    share = 1.0 if routing is None else expert_share(routing.experts, routing.routed, gen.tree)
    link = machine.pcie_gbps if cuda else None
    pass_s = placement.expected_pass_s(link, machine.disk_gbps, share) if placement.streamed else None
    drafting = tree_drafting_s(memory, gen) or 0.0
    speeds = None if pass_s is None else tuple(rate / (pass_s + drafting) for rate in gen.rates)
    return PairPlan(memory, pass_s, speeds, routing, gen)


def tree_drafting_s(memory: MemoryPlan, gen: GenRates) -> float | None:
    """A full tree's drafting at `gen`'s tree, where the draft's step was timed on this machine."""
    step = None if memory.draft is None else memory.draft.step
    return None if step is None else drafting_s(step, gen.tree)


def routing_of(target: str, placement: Placement) -> Routing | None:
    """How a MoE target's passes route, from its config, and what they stream placed as
    `placement`; None for a dense target."""
    shape = shape_of(read_config(target), torch.bfloat16)
    if not shape.experts:
        return None
    touched = tuple(experts_touched(shape.experts, shape.routed, n) for n in TREE_SIZES)
    streamed = tuple(placement.streamed_bytes(placement.streamed, count / shape.experts) for count in touched)
    return Routing(shape.experts, shape.routed, touched, streamed)


def pass_timing(pair: PairPlan, ram_gbps: float | None, disk_gbps: float | None) -> str:
    """How long the plan's streaming takes a pass, at which links' speeds."""
    placement = pair.memory.placement
    if not placement.streamed:
        return "no streaming: compute speed"
    if pair.pass_s is None:
        return "unknown (no measured or given link speed: --pcie-gbps, --disk-gbps)"
    tree = "" if pair.routing is None else f" over {pair.gen_rates.tree} tree tokens"
    return f"~{pair.pass_s:.2f} s streaming per pass{tree} at {link_speeds(placement, ram_gbps, disk_gbps)}"
