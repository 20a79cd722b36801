"""The options `generate`, `run` and `serve` share, declared once (`cli_options.with_engine_options`,
`with_sampling_options`, `with_penalty_options`): every field is an option of each, worded alike,
standing where the command names its parameter, and reaches what the command receives."""

from dataclasses import fields

import typer
from typer.testing import CliRunner

from specchat import cli_options, runtime
from specchat.cli import app
from specchat.cli_options import (ENGINE_OPTIONS, PENALTY_OPTIONS, SAMPLING_OPTIONS, PenaltyOptions, SamplingOptions,
                                  with_engine_options)
from specchat.decoding.events import SamplingParams
from specchat.serve.schema import Defaults
from specchat.engine_options import EngineOptions
from specchat.limits import DEFAULT_MAX_DEPTH
from specchat.tui.settings import DecodingSettings

FIELDS = [field.name for field in fields(EngineOptions)]
# Every option given a value other than its default, and the EngineOptions it must make.
EVERY_OPTION = ["--target", "t", "--draft", "d", "--engine", "sd", "--budget", "9", "--max-depth", "3",
                "--dtype", "float32", "--weights", "dense", "--offload", "disk", "--offload-dir", "/x",
                "--resident-layers", "2", "--ram-budget", "1.5", "--vram-budget", "2.5", "--context", "2048",
                "--draft-quant", "int8", "--draft-vocab", "0", "--lookahead", "7", "--workers", "cpu,cpu",
                "--ray-address", "auto", "--allow-pickle", "--ranked-tree"]
EXPECTED = EngineOptions(target="t", draft="d", engine="sd", budget=9, max_depth=3, dtype="float32", weights="dense",
                         offload="disk", offload_dir="/x", resident_layers=2, ram_budget=1.5, vram_budget=2.5,
                         context=2048, draft_quant="int8", draft_vocab=0, lookahead=7, workers="cpu,cpu",
                         ray_address="auto", allow_pickle=True, ranked_tree=True)


def declared(command: str) -> dict[str, tuple[str | None, object]]:
    """`command`'s options as --help shows them: name -> (help, default)."""
    return {param.name: (param.help, param.default) for param in typer.main.get_command(app).commands[command].params}


def recording_app(monkeypatch, **decoration) -> tuple[typer.Typer, list, list[EngineOptions]]:
    """A one-command app over with_engine_options that records (its --flag, the options) as it
    receives them, and the options checked, by their values and the models they name before torch
    loads and on the machine after (the checks themselves are the bad-input tests' business)."""
    received, checked = [], []
    monkeypatch.setattr(cli_options, "check_values", lambda options: checked.append(("values", options)))
    monkeypatch.setattr(cli_options, "check_named_models", lambda options: checked.append(("models", options)))
    monkeypatch.setattr(runtime, "validate", lambda options: checked.append(("machine", options)))
    recorder = typer.Typer()

    @recorder.command()
    @with_engine_options(**decoration)
    def record(flag: bool = typer.Option(False, "--flag"), *, options: EngineOptions) -> None:
        received.append((flag, options))

    return recorder, received, checked


def test_every_engine_options_field_is_declared_once_in_its_order():
    assert list(ENGINE_OPTIONS) == FIELDS


def test_generate_run_and_serve_word_the_shared_options_alike():
    generate, run, serve = declared("generate"), declared("run"), declared("serve")
    for name in FIELDS:
        assert generate[name] == serve[name], name
        if name not in ("engine", "max_depth"):
            assert run[name] == generate[name], name
    assert run["engine"][0] == generate["engine"][0] + " (/engine switches among those over the same models)"
    assert "max_depth" not in run


def test_every_option_reaches_the_engine_options_checked(monkeypatch):
    assert all(getattr(EXPECTED, name) != getattr(EngineOptions(), name) for name in FIELDS)  # each one is seen
    recorder, received, checked = recording_app(monkeypatch)
    result = CliRunner().invoke(recorder, ["--flag", *EVERY_OPTION])
    assert result.exit_code == 0, result.output
    assert received == [(True, EXPECTED)]
    assert checked == [("values", EXPECTED), ("models", EXPECTED), ("machine", EXPECTED)]


def test_an_option_left_out_is_not_offered_and_keeps_its_default(monkeypatch):
    recorder, received, _ = recording_app(monkeypatch, leave_out=("max_depth",))
    assert CliRunner().invoke(recorder, ["--max-depth", "3"]).exit_code == 2  # no such option
    assert CliRunner().invoke(recorder, ["--budget", "auto"]).exit_code == 0
    assert received == [(False, EngineOptions(budget="auto", max_depth=DEFAULT_MAX_DEPTH))]


def test_penalty_options_are_declared_once_and_named_as_the_chats_settings():
    """`with_penalty_options`' fields are typer's options and `DecodingSettings`' fields alike
    (`run` hands them over by name)."""
    names = [field.name for field in fields(PenaltyOptions)]
    assert list(PENALTY_OPTIONS) == names
    assert set(names) <= {field.name for field in fields(DecodingSettings)}
    generate, run, serve = declared("generate"), declared("run"), declared("serve")
    assert all(generate[name] == run[name] == serve[name] for name in names)


def test_sampling_options_are_declared_once_and_named_as_the_engines_and_the_chats_fields():
    names = [field.name for field in fields(SamplingOptions)]
    assert list(SAMPLING_OPTIONS) == names
    assert set(names) <= {field.name for field in fields(DecodingSettings)} & {field.name for field in
                                                                                fields(Defaults)}
    assert set(names) - {"mirostat_tau", "mirostat_eta"} <= {field.name for field in fields(SamplingParams)}
    generate, run, serve = declared("generate"), declared("run"), declared("serve")
    assert all(generate[name] == run[name] == serve[name] for name in names)


def test_the_sampling_options_stand_where_each_command_names_them_before_its_seed():
    for command in ("generate", "run", "serve"):
        order = [param.name for param in typer.main.get_command(app).commands[command].params]
        assert order[order.index("seed") - len(SAMPLING_OPTIONS):order.index("seed")] == list(SAMPLING_OPTIONS)


def test_sampling_options_become_the_engines_params_with_vllms_top_k_off_as_zero():
    options = SamplingOptions(temperature=0.3, top_p=0.7, top_k=-1, min_p=0.1, typical_p=0.8, top_n_sigma=2.0,
                              xtc_probability=0.4, xtc_threshold=0.2, dynatemp_range=0.6, dynatemp_exponent=2.0)
    assert options.params(9) == SamplingParams(temperature=0.3, top_p=0.7, seed=9, top_k=0, min_p=0.1, typical_p=0.8,
                                               top_n_sigma=2.0, xtc_probability=0.4, xtc_threshold=0.2,
                                               dynatemp_range=0.6, dynatemp_exponent=2.0)
