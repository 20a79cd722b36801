"""How `auto` chooses among plans that fit (plan/budget.py makes them), and says why: by how long
an iteration of a full tree takes, predicted before anything loads, where each draft form's step
was measured on this machine (models/draft_step.py) and the offload links' speeds are known; else
by the bytes a pass streams. A faster draft form may hold more bytes and leave more of
the target to stream; a smaller one may step slower (the 0.5B draft's layers on two CPU cores, 4-bit
against int8: 11.1 ms over one token against 13.1, 105.5 ms over 43 against 42.1; docs/benchmarks.md).
The prediction puts both on one scale:

  iteration = DRAFT_STEPS * step(ceil((n - 1) / DRAFT_STEPS)) + streamed bytes / link speed

for a tree of n tokens (its root included) drafted in the most steps a tree takes, its nodes shared
among them. The pass's compute is left out, the same whatever the draft's form; so is the ring's
overlap of streaming with drafting, which only shortens both forms' iterations.
"""

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from specchat.machine_links import Links
from specchat.models.draft_step import StepCost
from specchat.offload.placement import Placement
from specchat.transfer import gb

if TYPE_CHECKING:  # budget.py, which makes the plans, calls `chosen`
    from specchat.plan.budget import Ask, MemoryPlan

DRAFT_STEPS = 24  # the most draft steps a tree takes (decoding.tree.TreeShape's depth cap)


def chosen(ask: "Ask", plans: "list[MemoryPlan]") -> "MemoryPlan":
    """Of plans that differ in the draft's form (and the target's layers' form): the shortest
    predicted iteration where every plan has one, else the fewest bytes streamed a pass; min keeps
    the first of equals."""
    predictions = [predicted_s(plan, ask.links) for plan in plans]
    if None not in predictions:
        best = plans[predictions.index(min(predictions))]
    else:
        best = min(plans, key=lambda plan: plan.placement.pass_bytes)
    return replace(best, notes=choices(ask, best, plans))


def predicted_s(plan: "MemoryPlan", links: Links) -> float | None:
    """`plan`'s predicted iteration (`iteration_s`); None where it cannot be predicted."""
    if plan.draft is None:
        return None
    return iteration_s(plan.draft.step, plan.placement, plan.tree_tokens, links)


def choices(ask: "Ask", best: "MemoryPlan", plans: "list[MemoryPlan]") -> tuple[str, ...]:
    """What auto chose, in words, when it had a choice."""
    notes = []
    if best.compact_layers:
        notes.append("layers stream as the GGUF stores them (Q6_K linears, Q4_K scales), expanded as each runs: "
                     "fewer bytes a pass")
    if best.compact_head:
        notes.append("LM head in its stored Q6_K, expanded a chunk at a time on every pass: the bf16 head does not fit")
    if best.tree_tokens != ask.tree_tokens:
        notes.append(f"trees of at most {best.tree_tokens - 1} tokens: {ask.tree_tokens - 1} do not fit")
    if best.context != ask.contexts[0]:
        notes.append(f"context {best.context} tokens: {ask.contexts[0]} does not fit")
    if len(ask.drafts) > 1 and best.draft is not None:
        notes.append(draft_choice(ask, best, plans))
    return tuple(notes)


def draft_choice(ask: "Ask", best: "MemoryPlan", plans: "list[MemoryPlan]") -> str:
    """Why the draft is in `best`'s form: where no other form fits (in any of `plans`), that; else
    weighed against the other forms with the target's layers in `best`'s form: by predicted
    iteration where each has one, else by the bytes each streams."""
    if {plan.draft.form for plan in plans} == {best.draft.form}:
        unfit = ", ".join(draft.form for draft in ask.drafts if draft.form != best.draft.form)
        return f"draft in {best.draft.form}: the only form that fits ({unfit}: does not fit)"
    alike = [plan for plan in plans if plan.compact_layers == best.compact_layers]
    by_form = {plan.draft.form: plan for plan in alike}
    if all(predicted_s(plan, ask.links) is not None for plan in alike):
        weighed = "; ".join(iteration_terms(draft.form, draft.step, by_form[draft.form].placement,
                                            by_form[draft.form].tree_tokens, ask.links) if draft.form in by_form
                            else f"{draft.form}: does not fit" for draft in ask.drafts)
        return f"draft in {best.draft.form}: the shortest predicted iteration of a full tree ({weighed})"
    streamed = {form: gb(plan.placement.pass_bytes) for form, plan in by_form.items()}
    weighed = ", ".join(f"{draft.form}: {streamed.get(draft.form, 'does not fit')}" for draft in ask.drafts)
    return f"draft in {best.draft.form}: it streams the least per pass ({weighed})"


def step_width(tree_tokens: int) -> int:
    """The nodes of one step of a full tree of `tree_tokens` tokens (its root included)."""
    return max(1, math.ceil((tree_tokens - 1) / DRAFT_STEPS))


def drafting_s(step: StepCost, tree_tokens: int) -> float:
    """A full tree's drafting: its tree_tokens - 1 nodes in DRAFT_STEPS steps."""
    return DRAFT_STEPS * step.seconds(step_width(tree_tokens))


def iteration_s(step: StepCost | None, placement: Placement, tree_tokens: int, links: Links) -> float | None:
    """Seconds an iteration of a full tree takes: the draft's steps at `step`'s cost and the
    pass's streaming as `placement` places the target at the links' speeds. None where the step is
    unmeasured or a streamed tier's link speed unknown."""
    if step is None:
        return None
    streaming = placement.expected_pass_s(links.ram_gbps, links.disk_gbps) if placement.streamed else 0.0
    return None if streaming is None else drafting_s(step, tree_tokens) + streaming


def iteration_terms(form: str, step: StepCost, placement: Placement, tree_tokens: int, links: Links) -> str:
    """An iteration's prediction in words: the draft's steps, the bytes streamed, the seconds."""
    width = step_width(tree_tokens)
    return (f"{form}: {DRAFT_STEPS} steps of {width} tokens at {step.seconds(width) * 1e3:.1f} ms, "
            f"{gb(placement.pass_bytes)} streamed: {iteration_s(step, placement, tree_tokens, links):.2f} s")
