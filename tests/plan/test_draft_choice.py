"""`auto` weighs the draft's forms by the iteration each predicts (plan/choice.py): a full tree's
draft steps at the cost measured on this machine, plus the pass's streaming at the links' speeds;
by the bytes each streams where a step or a link speed is unknown. The step costs here are stand-ins
(models/draft_step.py measures the real ones); the arithmetic is written out."""

import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers.plan_sizes import GB, NOWHERE, TARGET_LAYER

import specchat.plan.pair as pair_module
from specchat.errors import SpecchatError
from specchat.machine_links import Links
from specchat.models.draft_step import StepCost
from specchat.plan import choice
from specchat.plan.budget import Ask
from specchat.plan.demand import ModelShape
from specchat.plan.draft_form import Draft
from specchat.plan.machine import Machine, described_rooms
from specchat.plan.pair import plan_pair
from specchat.plan.request import Pair, PlanRequest

TREE = 1025  # a full tree of 1024 nodes: 24 steps of ceil(1024 / 24) = 43
WIDTH = 43
FAST, SLOW = StepCost(0.010, 0.040, WIDTH), StepCost(0.012, 0.110, WIDTH)  # a CPU's bf16 and 4-bit steps, about
AMPLE = described_rooms(None, 24 * GB)


def pair(kinds: tuple[str, ...]) -> Pair:
    return Pair("qwen2.5-coder-1.5b", torch.bfloat16, draft="qwen2.5-coder-0.5b", draft_kinds=kinds,
                draft_vocab=32768, context=4096, measure_steps=True)


def plan(monkeypatch, kinds: tuple[str, ...], costs: dict, links: Links, room: int | None = None):
    """The embedded pair planned with the draft in `kinds`, each form's step costing `costs[kind]`,
    in `room` bytes of RAM (None: ample)."""
    widths = set()

    def stand_in(draft, quant, dtype, device, wide):
        widths.add(wide)
        return costs[quant.kind]

    monkeypatch.setattr(pair_module, "step_cost", stand_in)
    request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE, links=links)
    rooms = AMPLE if room is None else replace(AMPLE, device=room)
    memory = plan_pair(pair(kinds), request, Machine(rooms=rooms))
    assert widths <= {WIDTH}
    return memory


@pytest.fixture
def tight(monkeypatch) -> int:
    """RAM that holds the pair with its int4 draft but four of the target's layers."""
    return plan(monkeypatch, ("int4",), {"int4": FAST}, Links()).total("device") - 4 * TARGET_LAYER


def predicted(memory, disk_gbps: float, step: StepCost) -> float:
    """24 steps of 43 nodes, then the pass's layers read from disk."""
    return 24 * step.seconds(WIDTH) + memory.placement.disk_bytes / (disk_gbps * 1e9)


def test_a_draft_that_streams_more_but_steps_faster_is_chosen(monkeypatch, tight):
    """Full weights (their linears 2 bytes a weight) against the same linears rounded to 4 bits."""
    memory = plan(monkeypatch, ("none", "int4"), {"none": FAST, "int4": SLOW}, Links(disk_gbps=1.5), tight)
    int4 = plan(monkeypatch, ("int4",), {"int4": SLOW}, Links(disk_gbps=1.5), tight)
    assert memory.draft.quant == "none"
    assert memory.placement.pass_bytes > int4.placement.pass_bytes > 0  # the 4-bit draft leaves more room
    note = next(note for note in memory.notes if note.startswith("draft in none"))
    assert "the shortest predicted iteration of a full tree" in note
    seconds = {form: float(value) for form, value in re.findall(r"(none|int4): 24 steps of 43 tokens at [\d.]+ ms, "
                                                                  r"[\d.]+ GB streamed: ([\d.]+) s", note)}
    # the note prints seconds to two decimals: at most 0.005 from the arithmetic, no measurement in it
    assert seconds["none"] == pytest.approx(predicted(memory, 1.5, FAST), abs=0.005)
    assert seconds["int4"] == pytest.approx(predicted(int4, 1.5, SLOW), abs=0.005)
    assert seconds["none"] < seconds["int4"]


def test_a_draft_that_streams_less_and_steps_as_fast_is_chosen(monkeypatch, tight):
    memory = plan(monkeypatch, ("none", "int4"), {"none": FAST, "int4": FAST}, Links(disk_gbps=1.5), tight)
    assert memory.draft.quant == "int4"


def test_in_memory_the_faster_step_wins_whatever_the_order(monkeypatch):
    memory = plan(monkeypatch, ("int4", "none"), {"none": FAST, "int4": SLOW}, Links())
    assert not memory.placement.streamed and memory.draft.quant == "none"
    assert any(note.startswith("draft in none: the shortest predicted iteration") for note in memory.notes)


@pytest.mark.parametrize("links", [Links(), Links(ram_gbps=25.0)], ids=["no speeds", "no disk speed"])
def test_without_the_disks_speed_the_fewest_bytes_win(monkeypatch, tight, links):
    memory = plan(monkeypatch, ("none", "int4"), {"none": FAST, "int4": SLOW}, links, tight)
    assert memory.draft.quant == "int4" and memory.placement.disk
    assert any(note.startswith("draft in int4: it streams the least per pass") for note in memory.notes)


def test_where_one_form_alone_fits_the_note_says_so(monkeypatch, tight):
    """RAM that holds the int4 draft's plan with every target layer streamed, and half the bf16
    draft's extra weights: only the int4 form fits, whichever step is faster."""
    int4 = plan(monkeypatch, ("int4",), {"int4": FAST}, Links(disk_gbps=1.5), tight)
    bf16 = plan(monkeypatch, ("none",), {"none": FAST}, Links(disk_gbps=1.5))
    room = (int4.total("device") - int4.placement.resident * TARGET_LAYER
            + (bf16.draft.weights - int4.draft.weights) // 2)
    with pytest.raises(SpecchatError):
        plan(monkeypatch, ("none",), {"none": FAST}, Links(disk_gbps=1.5), room)
    memory = plan(monkeypatch, ("none", "int4"), {"none": FAST, "int4": SLOW}, Links(disk_gbps=1.5), room)
    assert memory.draft.quant == "int4"
    assert "draft in int4: the only form that fits (none: does not fit)" in memory.notes


class Planned:
    """What `choices` reads of a plan at the asked context and tree, its draft's step unmeasured."""

    def __init__(self, quant: str, compact_layers: bool, pass_bytes: int) -> None:
        self.draft = Draft(quant, 0, ModelShape(2, 1, 4, 8, 16, 64, 2), 0)
        self.compact_layers, self.compact_head, self.tree_tokens, self.context = compact_layers, False, TREE, 4096
        self.placement = SimpleNamespace(pass_bytes=pass_bytes)


def test_a_form_that_fits_beside_the_other_layers_form_is_not_the_only_one_that_fits():
    """The target's Q6_K layers kept dense or compact are plans of their own: a form that fits only
    beside the compact ones still fits."""
    ask = Ask(contexts=(4096,), drafts=(Planned("none", True, 0).draft, Planned("int4", True, 0).draft),
              tree_tokens=TREE, workspace=0)
    best = Planned("int4", False, 2 * GB)
    assert choice.choices(ask, best, [best, Planned("none", True, GB)])[0].startswith(
        "draft in int4: it streams the least per pass")
    assert choice.choices(ask, best, [best, Planned("int4", True, GB)]) == (
        "draft in int4: the only form that fits (none: does not fit)",)


def test_a_form_whose_step_is_unmeasured_leaves_the_choice_to_bytes(monkeypatch, tight):
    memory = plan(monkeypatch, ("none", "int4"), {"none": FAST, "int4": None}, Links(disk_gbps=1.5), tight)
    assert memory.draft.quant == "int4"


def test_steps_are_not_measured_without_a_choice_to_make(monkeypatch):
    monkeypatch.setattr(pair_module, "step_cost", lambda *args: pytest.fail("measured"))
    request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE, links=Links(disk_gbps=1.5))
    memory = plan_pair(pair(("none",)), request, Machine(rooms=AMPLE))
    assert memory.draft.step is None
    assert math.isclose(memory.placement.pass_bytes, 0)


def test_a_draft_stored_in_4_bits_is_weighed_packed_against_expanded(monkeypatch):
    """llama-3.1-8b-awq beside its 70B on a described 24 GB card with pinned RAM at PCIe 4 speed:
    packed (none) leaves room for more of the target's layers, expanded (dense) steps faster; the
    iteration each predicts decides, and packed wins where both step alike. The expanded draft
    (15.3 GB) fits beside the target because its input embedding is held on the host."""
    def planned(costs: dict) -> object:
        monkeypatch.setattr(pair_module, "step_cost", lambda draft, quant, dtype, device, wide: costs[quant.kind])
        stored = Pair("llama-3.1-70b-awq", torch.bfloat16, draft="llama-3.1-8b-awq", draft_kinds=("none", "int4"),
                      draft_vocab=32768, context=4096, measure_steps=True)
        request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE, links=Links(ram_gbps=25.0))
        return plan_pair(stored, request, Machine(vram_gb=24, ram_gb=64))

    faster = planned({"none": StepCost(0.010, 0.060, WIDTH), "dense": StepCost(0.008, 0.012, WIDTH)})
    alike = planned({"none": FAST, "dense": FAST})
    assert faster.draft.quant == "dense" and alike.draft.quant == "none"
    # the 8B's 32 layers of 218 M weights in bf16 (14 GB) against their 4-bit words and scales (~3.8 GB)
    assert faster.draft.weights - alike.draft.weights > 10 * GB
    assert faster.placement.pass_bytes > alike.placement.pass_bytes
    note = next(note for note in faster.notes if note.startswith("draft in dense"))
    assert "none: 24 steps of 43 tokens at 60.0 ms" in note and "dense: 24 steps of 43 tokens at 12.0 ms" in note


@pytest.mark.parametrize("tree_tokens, width", [(1, 1), (2, 1), (25, 1), (26, 2), (49, 2), (50, 3), (TREE, WIDTH)])
def test_a_full_trees_nodes_are_shared_among_24_steps(tree_tokens, width):
    """ceil((n - 1) / 24) nodes a step for a tree of n tokens (its root drafts nothing), one at least."""
    assert choice.step_width(tree_tokens) == width
    assert choice.drafting_s(FAST, tree_tokens) == pytest.approx(24 * FAST.seconds(width))


class Resident:
    """A placement that streams nothing: it has no link to be timed on."""

    streamed = False

    def expected_pass_s(self, ram_gbps, disk_gbps):
        pytest.fail("a resident placement's pass was timed")


def test_an_iteration_that_streams_nothing_is_its_drafting():
    assert choice.iteration_s(FAST, Resident(), TREE, Links()) == pytest.approx(choice.drafting_s(FAST, TREE))
    assert choice.iteration_s(None, Resident(), TREE, Links()) is None


def test_a_single_draft_form_gets_no_note_on_its_choice(monkeypatch):
    memory = plan(monkeypatch, ("int4",), {"int4": FAST}, Links(disk_gbps=1.5))
    assert memory.draft.quant == "int4"
    assert not any(note.startswith("draft in") for note in memory.notes)
