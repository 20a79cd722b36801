"""`specchat run` driven through the command line: the app replaced by a recorder, which runs the
loader it is given as the loading screen does, over tiny models instead of the real pair. What
the app receives (the store, the conversation to reopen) and what the loader builds (the options
it loads with, the engine and settings of the first reply) must carry the command's values."""

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
import torch
from helpers.cli import assert_one_line_error, run_cli

from specchat.engine_options import EngineOptions
from specchat.limits import DEFAULT_SEED
from specchat.runtime import Models
from specchat.tui.settings import DecodingSettings
from specchat.tui.store import ConversationStore, default_path

RUN_ARGS = ["--engine", "sd", "--budget", "5", "--seed", "7", "--temperature", "0.3", "--top-p", "0.9",
            "--context", "2048"]


@dataclass
class Recorded:
    """What the stand-in app was given, and what its loader built."""

    apps: list["RecordingApp"] = field(default_factory=list)
    loaded_with: list[EngineOptions] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)


class RecordingApp:
    """Takes SpecchatApp's arguments; `run` calls the loader, as the app's loading screen does."""

    recorded: Recorded  # set per test by the `recorded` fixture

    def __init__(self, backend, store, conversation_id=None, loader=None) -> None:
        self.backend, self.store, self.conversation_id, self.loader = backend, store, conversation_id, loader
        self.recorded.apps.append(self)

    def run(self) -> None:
        self.backend = self.loader(lambda step, fraction: self.recorded.steps.append(step))


@pytest.fixture
def recorded(monkeypatch, tiny_target, tiny_draft) -> Recorded:
    """The app replaced by RecordingApp; the loader's load_models by one that records its options
    and hands back tiny models (a tokenizer with a chat template is all the backend reads of it)."""
    record = Recorded()

    def load_tiny(options: EngineOptions, progress: bool, report) -> Models:
        record.loaded_with.append(options)
        report("loaded the tiny pair", None)
        return Models(tokenizer=SimpleNamespace(chat_template="role: content"), stop_ids=frozenset(),
                      device=torch.device("cpu"), context=options.context, target=tiny_target, draft=tiny_draft)

    monkeypatch.setattr(RecordingApp, "recorded", record, raising=False)
    monkeypatch.setattr("specchat.tui.app.SpecchatApp", RecordingApp)
    monkeypatch.setattr("specchat.tui.runtime_backend.load_models", load_tiny)
    return record


def stored_conversations() -> tuple[int, int]:
    """Two conversations in the test's private history; the older one was updated last."""
    store = ConversationStore()
    try:
        older = store.new_conversation("older", "")
        newer = store.new_conversation("newer", "")
        store.add_message(older, "user", "still going")
        assert store.last_conversation_id() == older  # the last updated, not the last created
    finally:
        store.close()
    return older, newer


def test_run_reopens_the_last_conversation_with_the_command_line_settings(monkeypatch, capsys, recorded):
    older, _ = stored_conversations()
    code, _, err = run_cli(monkeypatch, capsys, "run", "--continue", *RUN_ARGS)
    assert code == 0, err
    (app,) = recorded.apps
    assert app.conversation_id == older and app.store.path == default_path()
    assert recorded.loaded_with == [replace(EngineOptions(), engine="sd", budget=5, context=2048)]
    assert recorded.steps == ["loaded the tiny pair"]  # the steps reach the loading screen
    backend = app.backend
    assert backend.engine.name == "sd" and backend.engine.live_settings().budget == 5
    assert backend.context == 2048
    assert backend.settings == DecodingSettings(budget=5, temperature=0.3, top_p=0.9, seed=7, engine="sd")
    assert backend.settings.sampling().seed == 7  # every reply samples with the command's seed


def test_run_without_continue_starts_a_new_conversation_on_the_default_seed(monkeypatch, capsys, recorded):
    stored_conversations()
    code, _, err = run_cli(monkeypatch, capsys, "run", "--engine", "specinfer", "--budget", "6", "--system", "Be brief.")
    assert code == 0, err
    (app,) = recorded.apps
    assert app.conversation_id is None
    assert recorded.loaded_with == [replace(EngineOptions(), engine="specinfer", budget=6)]
    assert app.backend.engine.name == "specinfer" and app.backend.settings.seed == DEFAULT_SEED
    assert app.backend.settings.system_prompt == "Be brief."  # the new conversation's system prompt


def test_a_system_prompt_for_a_reopened_conversation_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "run", "--continue", "--system", "Be brief.")
    assert_one_line_error(code, err, "--continue reopens a conversation with its own system prompt")
