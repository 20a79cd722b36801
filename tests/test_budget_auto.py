"""--budget auto through the engine and the Models bundle: exact tokens, trees sized by the costs,
live switching, the probe and its cache."""

from types import SimpleNamespace

import pytest
import torch
from test_engines import run

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.autosize import Costs
from specchat.decoding.events import AUTO, LiveSettings, SamplingParams
from specchat.decoding.probe import doubling, probe_costs
from specchat.probe_cache import probe_path, read_costs, write_costs
from specchat.runtime import Models

GREEDY, SEEDED = SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 3)
CHEAP_DRAFT = Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(0.001, 0.001))
COSTLY_DRAFT = Costs(target_n=(1, 129), target_s=(0.1, 1.0), draft_b=(1, 128), draft_s=(0.2, 0.2))


def tiny_models(target, draft, costs: Costs | None) -> Models:
    return Models(tokenizer=None, stop_ids=frozenset(), device=torch.device("cpu"), context=1024,
                  target=target, draft=draft, costs=costs)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_auto_emits_the_target_tokens(tiny_target, tiny_draft, sampling):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = tiny_models(tiny_target, tiny_draft, CHEAP_DRAFT).engine("specexec", LiveSettings(budget=AUTO))
    tokens, events = run(engine, sampling)
    assert tokens == reference
    assert engine.live_settings().budget == AUTO
    assert all(0 <= e.tree_size <= 128 for e in events) and any(e.predicted_accepted > 0 for e in events)


def test_cheap_drafting_grows_bigger_trees_than_costly_drafting(tiny_target, tiny_draft):
    sizes = {}
    for label, costs in (("cheap", CHEAP_DRAFT), ("costly", COSTLY_DRAFT)):
        engine = tiny_models(tiny_target, tiny_draft, costs).engine("specexec", LiveSettings(budget=AUTO))
        _, events = run(engine, GREEDY)
        sizes[label] = sum(e.tree_size for e in events) / len(events)
    assert sizes["cheap"] > 2 * sizes["costly"]


def test_budget_switches_between_fixed_and_auto_live(tiny_target, tiny_draft):
    engine = tiny_models(tiny_target, tiny_draft, CHEAP_DRAFT).engine("specexec", LiveSettings(budget=AUTO))
    engine.apply(LiveSettings(budget=6))
    _, events = run(engine, GREEDY, max_new_tokens=12)
    assert engine.live_settings().budget == 6 and {e.tree_size for e in events[1:]} <= {6}  # [0]: the prompt's pass
    assert all(e.predicted_accepted == 0 for e in events)
    engine.apply(LiveSettings(budget=AUTO))
    assert engine.live_settings().budget == AUTO


def test_engines_that_cannot_size_their_trees_keep_a_fixed_budget(tiny_target, tiny_draft):
    models = tiny_models(tiny_target, tiny_draft, CHEAP_DRAFT)
    assert models.engine("sd", LiveSettings(budget=AUTO)).live_settings().budget == 16  # the CPU default
    without_costs = tiny_models(tiny_target, tiny_draft, None).engine("specexec", LiveSettings(budget=8))
    without_costs.apply(LiveSettings(budget=AUTO))
    assert without_costs.live_settings().budget == 8


def test_the_probe_times_doubling_sizes(tiny_target, tiny_draft):
    assert doubling(9) == [1, 2, 4, 8, 9]
    costs = probe_costs(tiny_target, tiny_draft, cap=8)
    assert costs.target_n[0] == 1 and costs.target_n == tuple(sorted(costs.target_n)) and costs.target_n[-1] <= 9
    assert costs.draft_b[0] == 1 and all(seconds > 0 for seconds in costs.target_s + costs.draft_s)
    assert (costs.stream_s, costs.staged) == (0.0, 1.0)  # nothing streams


def test_probed_costs_are_cached_per_machine_and_models(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    path = probe_path(cpu, {"target": "a", "draft": "b"})
    assert path.is_relative_to(tmp_path) and read_costs(path) is None
    streamed = Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1,), draft_s=(0.01,), stream_s=2.5, staged=0.5)
    write_costs(path, streamed)
    assert read_costs(path) == streamed
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
