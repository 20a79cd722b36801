"""The checks the engine options' values alone decide (engine_options.check_values), at their edges,
and the models `check_named_models` checks; the command line's wording of each refusal is
tests/test_cli.py's."""

import pytest

from specchat import engine_options
from specchat.decoding.events import AUTO
from specchat.engine_options import EngineOptions, check_named_models, check_values
from specchat.errors import SpecchatError


@pytest.mark.parametrize("options", [
    EngineOptions(offload="disk", resident_layers=0),  # every layer streamed
    EngineOptions(draft_vocab=0),  # the whole vocabulary
    EngineOptions(budget=AUTO), EngineOptions(engine="dsi", budget=AUTO),
    EngineOptions(budget=1), EngineOptions(budget=8192), EngineOptions(max_depth=1), EngineOptions(context=64),
    EngineOptions(offload="ram", ram_budget=4.0, vram_budget=2.0),
    EngineOptions(engine="dsi", offload="none", lookahead=1), EngineOptions(engine="dsi", lookahead=64),
    EngineOptions(engine="autoregressive", lookahead=64),
], ids=["resident-0", "vocab-0", "auto", "dsi-auto", "budget-1", "budget-8192", "depth-1", "context-64",
        "budgets-offloaded", "dsi-in-memory", "dsi-lookahead-64", "lookahead-64"])
def test_values_at_their_edges_pass(options):
    check_values(options)


@pytest.mark.parametrize(("options", "message"), [
    (EngineOptions(budget=0), "--budget"), (EngineOptions(budget=8193), "--budget"),
    (EngineOptions(engine="specinfer", budget=AUTO), "--budget auto is for the specexec engine, not specinfer"),
    (EngineOptions(max_depth=0), "--max-depth"), (EngineOptions(context=63), "--context"),
    (EngineOptions(offload="none", resident_layers=0), "--resident-layers counts the layers"),
    (EngineOptions(offload="none", vram_budget=2.0), "--vram-budget caps where offloaded layers go"),
    (EngineOptions(offload="none", ram_budget=4.0, vram_budget=2.0), "--ram-budget caps where offloaded layers go"),
    (EngineOptions(offload="ram", ram_budget=0.0), "--ram-budget must be in"),
    (EngineOptions(lookahead=0), "--lookahead"),  # checked whatever the engine
    (EngineOptions(engine="dsi", ray_address="auto", offload="ram"), "--engine dsi keeps a target on every worker"),
])
def test_values_past_their_edges_are_one_line(options, message):
    with pytest.raises(SpecchatError, match=message):
        check_values(options)


@pytest.mark.parametrize(("engine", "checked"), [("autoregressive", ["t"]), ("specexec", ["t", "d"]),
                                                 ("sd", ["t", "d"]), ("dsi", ["t", "d"])])
def test_the_draft_is_checked_only_where_the_engine_drafts(monkeypatch, engine, checked):
    seen = []

    def record(specs, allow_pickle: bool) -> None:
        seen.append((list(specs), allow_pickle))

    monkeypatch.setattr(engine_options, "check_models", record)
    check_named_models(EngineOptions(target="t", draft="d", engine=engine, allow_pickle=True))
    assert seen == [(checked, True)]
