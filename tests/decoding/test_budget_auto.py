"""--budget auto through the engine and the Models bundle: exact tokens, trees sized by the costs,
live switching, and the probe's cache (the probe itself: test_probe.py)."""

from types import SimpleNamespace

import pytest
import torch
from helpers.engines import Alternating, run
from helpers.tiny import tiny_models

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.autosize import LOOK_SHARE, AutoSizer, Costs
from specchat.decoding.calibration import MIN_TREES
from specchat.decoding.events import ALONE, AUTO, DRAFTED, LiveSettings, SamplingParams
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.probe_cache import probe_path, read_costs, write_costs
from specchat.runtime import Models

GREEDY, SEEDED = SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 3)
CHEAP_DRAFT = Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(0.001, 0.001))
COSTLY_DRAFT = Costs(target_n=(1, 129), target_s=(0.1, 1.0), draft_b=(1, 128), draft_s=(0.2, 0.2))


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_auto_emits_the_target_tokens(tiny_target, tiny_draft, sampling):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = tiny_models(tiny_target, tiny_draft, costs=CHEAP_DRAFT).engine("specexec", LiveSettings(budget=AUTO))
    tokens, events = run(engine, sampling)
    assert tokens == reference
    assert engine.live_settings().budget == AUTO
    assert all(0 <= e.tree_size <= 128 for e in events) and any(e.predicted_accepted > 0 for e in events)


def auto_engine(target, draft, sizer: AutoSizer) -> TreeEngine:
    return TreeEngine(SPECEXEC, target, draft, [], TreeShape(budget=sizer.cap, sizer=sizer), sizer)


def test_cheap_drafting_grows_bigger_trees_than_costly_drafting(tiny_target, tiny_draft):
    """The stand-in costs hold as given: learned from the tiny models' times, both would become those."""
    sizes = {}
    for label, costs in (("cheap", CHEAP_DRAFT), ("costly", COSTLY_DRAFT)):
        engine = auto_engine(tiny_target, tiny_draft, AutoSizer(costs, cap=128, learns_costs=False))
        _, events = run(engine, GREEDY)
        sizes[label] = sum(e.tree_size for e in events) / len(events)
    assert sizes["cheap"] > 2 * sizes["costly"]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_dearer_than_what_it_saves_leaves_the_target_alone(tiny_target, tiny_draft, sampling):
    """A draft step costs 1 s against a 0.1 s pass: after the first tree and MIN_TREES more (drafted
    to learn), every iteration is the target alone's, 1/(0.1 * 1.02) = 9.8 tokens/s against at most
    (K + 1) / (1 s + ...) for a tree; a look would cost over 1.9 s, 2% of ~950 tokens' time: none
    in 40 tokens."""
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    dear = Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(1.0, 1.0))
    tokens, events = run(auto_engine(tiny_target, tiny_draft, AutoSizer(dear, cap=128, learns_costs=False)), sampling)
    assert tokens == reference
    learning = 2 + MIN_TREES  # events[0] is the prompt's pass, events[1] the first (cold) tree
    assert {e.drafting for e in events[1:learning]} == {DRAFTED} and {e.drafting for e in events[learning:]} == {ALONE}
    assert all(e.tree_size == 0 and e.draft_s == 0 and e.draft_steps == 0 for e in events[learning:])
    alone = 1 / (0.1 * (1 + LOOK_SHARE))
    assert events[learning].rate_alone == pytest.approx(alone) and 0 < events[learning].rate_with_tree < alone


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafting_off_and_on_within_a_reply_keeps_the_target_tokens(tiny_target, tiny_draft, sampling):
    """The draft cache falls behind while the target is alone and catches up in the next tree."""
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    tokens, events = run(auto_engine(tiny_target, tiny_draft, Alternating(CHEAP_DRAFT, cap=16)), sampling)
    assert tokens == reference
    kinds = [e.drafting for e in events[1:]]
    assert kinds[:5] == [DRAFTED, DRAFTED, ALONE, ALONE, ALONE]
    assert sum(e.accepted for e in events) > 0  # trees after the target-alone runs were used


def test_budget_switches_between_fixed_and_auto_live(tiny_target, tiny_draft):
    engine = tiny_models(tiny_target, tiny_draft, costs=CHEAP_DRAFT).engine("specexec", LiveSettings(budget=AUTO))
    engine.apply(LiveSettings(budget=6))
    _, events = run(engine, GREEDY, max_new_tokens=12)
    assert engine.live_settings().budget == 6 and {e.tree_size for e in events[1:]} <= {6}  # [0]: the prompt's pass
    assert all(e.predicted_accepted == 0 for e in events)
    engine.apply(LiveSettings(budget=AUTO))
    assert engine.live_settings().budget == AUTO


def test_engines_that_cannot_size_their_trees_keep_a_fixed_budget(tiny_target, tiny_draft):
    models = tiny_models(tiny_target, tiny_draft, costs=CHEAP_DRAFT)
    assert models.engine("sd", LiveSettings(budget=AUTO)).live_settings().budget == 16  # the CPU default
    without_costs = tiny_models(tiny_target, tiny_draft).engine("specexec", LiveSettings(budget=8))
    without_costs.apply(LiveSettings(budget=AUTO))
    assert without_costs.live_settings().budget == 8


def test_probed_costs_are_cached_per_machine_and_models(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    path = probe_path(cpu, {"target": "a", "draft": "b"})
    assert path.is_relative_to(tmp_path) and read_costs(path) is None
    streamed = Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1,), draft_s=(0.01,), stream_s=2.5, staged=0.5)
    write_costs(path, streamed, 0.1)
    assert read_costs(path) == (streamed, 0.1)
    assert probe_path(cpu, {"target": "a", "draft": "c"}) != path
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left


def test_auto_trees_stay_within_the_tree_the_memory_plan_made_room_for(tiny_target, tiny_draft):
    """A plan that shrank the largest tree to fit (offload/budget.py) caps --budget auto there."""
    plan = SimpleNamespace(tree_tokens=257)  # a 256-token tree and its root
    models = Models(tokenizer=None, stop_ids=frozenset(), device=torch.device("cpu"), context=512,
                    target=tiny_target, draft=tiny_draft, offload=object(), memory=plan)
    assert models.auto_cap() == 256  # the sizer's cap (Models.sizer)
    models.memory = SimpleNamespace(tree_tokens=4097)
    assert models.auto_cap() == 1024  # the offloaded CPU cap, where the plan made room for more
