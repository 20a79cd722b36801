"""How many conversations' KV caches a run keeps room for. `run` and `generate` keep one; `serve
--slots N` keeps N, each slot reusing its conversation's caches. `--slots auto` (serve's default)
keeps AUTO_SLOTS where their caches cost the first conversation nothing, else one, as Ollama runs
4 parallel requests, or 1 where memory is short: nothing costs nothing when every layer sits
where it would with one (the same resident layers, tiers and ring), with the same context,
largest tree, draft form and dense copies; only room left over then holds the caches. On a GPU
that streams the target's layers every byte of the card holds layers, so there auto keeps one."""

from dataclasses import replace

from specchat.errors import PlanRefusal
from specchat.plan.budget import MemoryPlan
from specchat.plan.machine import Machine
from specchat.plan.model import MeasuredModel, plan_measured

AUTO_SLOTS = 4  # Ollama's OLLAMA_NUM_PARALLEL where memory allows


def plan_conversations(measured: MeasuredModel, machine: Machine) -> MemoryPlan:
    """The plan of `measured` for the conversations its request asks (None: auto)."""
    asked = measured.request.conversations
    if asked is not None:
        return plan_measured(keeping(measured, asked), machine)
    single = plan_measured(keeping(measured, 1), machine)
    try:
        several = plan_measured(keeping(measured, AUTO_SLOTS), machine)
    except PlanRefusal:
        return single
    return several if run_of(several) == run_of(single) else single


def keeping(measured: MeasuredModel, conversations: int) -> MeasuredModel:
    return replace(measured, ask=replace(measured.ask, conversations=conversations))


def run_of(plan: MemoryPlan) -> tuple:
    """What decides how fast a conversation runs under `plan`: where each layer is, the ring, the
    context, the largest tree, the draft's form, the target's compact parts and dense copies."""
    placement = plan.placement
    return (placement.resident, placement.ram, placement.disk, placement.slots, placement.expert_cache, plan.context,
            plan.tree_tokens, plan.draft, plan.compact_head, plan.compact_layers, plan.dense_copies)
