"""Slash-command parsing, completion and help, and the settings' validation."""

from pathlib import Path

import pytest

from specchat.tui import commands
from specchat.tui.app import SpecchatApp
from specchat.tui.attach import Attach
from specchat.tui.chat_input import ChatInput
from specchat.tui.commands import Clear, CommandError, Help, Load, Quit, Retry, Save, SetSetting, Stats, parse
from specchat.tui.settings import DecodingSettings

PACKAGE_INIT = Path(commands.__file__).with_name("__init__.py")  # no run of 3 backticks in it: a plain fence, for /file

VALID = {
    "/budget 256": SetSetting("budget", 256),
    "/budget auto": SetSetting("budget", "auto"),
    "/budget AUTO": SetSetting("budget", "auto"),
    "/depth 8": SetSetting("depth", 8),
    "/lookahead 1": SetSetting("lookahead", 1),
    "/lookahead 64": SetSetting("lookahead", 64),
    "/temp 0": SetSetting("temperature", 0.0),
    "/temp 1.5": SetSetting("temperature", 1.5),
    "/top-p 1": SetSetting("top_p", 1.0),
    "/top-k 40": SetSetting("top_k", 40),
    "/top-k 0": SetSetting("top_k", 0),
    "/min-p 0.05": SetSetting("min_p", 0.05),
    "/min-p 0": SetSetting("min_p", 0.0),
    "/typical-p 0.9": SetSetting("typical_p", 0.9),
    "/typical-p 1": SetSetting("typical_p", 1.0),
    "/top-n-sigma 1.5": SetSetting("top_n_sigma", 1.5),
    "/top-n-sigma -1": SetSetting("top_n_sigma", -1.0),
    "/xtc-probability 0.5": SetSetting("xtc_probability", 0.5),
    "/xtc-threshold 0.2": SetSetting("xtc_threshold", 0.2),
    "/dynatemp-range 0.5": SetSetting("dynatemp_range", 0.5),
    "/dynatemp-exponent 1.5": SetSetting("dynatemp_exponent", 1.5),
    "/mirostat 2": SetSetting("mirostat", 2),
    "/mirostat 0": SetSetting("mirostat", 0),
    "/mirostat-tau 3.5": SetSetting("mirostat_tau", 3.5),
    "/mirostat-eta 0.2": SetSetting("mirostat_eta", 0.2),
    "/repeat-penalty 1.1": SetSetting("repeat_penalty", 1.1),
    "/repeat-last-n -1": SetSetting("repeat_last_n", -1),
    "/dry-multiplier 0.8": SetSetting("dry_multiplier", 0.8),
    "/dry-base 2": SetSetting("dry_base", 2.0),
    "/dry-allowed-length 3": SetSetting("dry_allowed_length", 3),
    "/dry-penalty-last-n -1": SetSetting("dry_penalty_last_n", -1),
    "/presence-penalty 0.5": SetSetting("presence_penalty", 0.5),
    "/frequency-penalty -0.5": SetSetting("frequency_penalty", -0.5),
    "/seed 42": SetSetting("seed", 42),
    "/seed off": SetSetting("seed", None),
    "/max-tokens 32768": SetSetting("max_tokens", 32768),
    "/engine autoregressive": SetSetting("engine", "autoregressive"),
    "/system You are terse.": SetSetting("system_prompt", "You are terse."),
    "/json on": SetSetting("reply_form", {"type": "object"}),
    "/json off": SetSetting("reply_form", None),
    "/schema off": SetSetting("reply_form", None),
    "/grammar off": SetSetting("reply_form", None),
    f"/file {PACKAGE_INIT}": Attach(f"`{PACKAGE_INIT}`:\n```python\n{PACKAGE_INIT.read_text()}```\n", str(PACKAGE_INIT),
                                    PACKAGE_INIT.read_text().count("\n")),
    "/clear": Clear(),
    "/retry": Retry(),
    "/save": Save(None),
    "/save notes/chat.md": Save("notes/chat.md"),
    "/load 3": Load(3),
    "/load": Load(None),
    "/stats": Stats(),
    "/help": Help(),
    "/quit": Quit(),
    "  /budget   12  ": SetSetting("budget", 12),
    "/budget\n64": SetSetting("budget", 64),  # Ctrl+J after the name
    "/system Be terse.\nUse lists.": SetSetting("system_prompt", "Be terse.\nUse lists."),
}

INVALID = {
    "/budget -5": "budget must be between 1 and 8192 (got -5)",
    "/budget abc": "/budget needs a whole number or 'auto' (got 'abc')",
    "/budget 9000": "budget must be between 1 and 8192 (got 9000)",
    "/budget": "usage: /budget N|auto",
    "/budget 1.5": "/budget needs a whole number or 'auto' (got '1.5')",
    "/budget 1\n2": "/budget needs a whole number or 'auto' (got '1\\n2')",  # one line, always
    "/depth 0": "depth must be between 1 and 256 (got 0)",
    "/lookahead 0": "lookahead must be between 1 and 64 (got 0)",
    "/lookahead 65": "lookahead must be between 1 and 64 (got 65)",
    "/lookahead two": "/lookahead needs a whole number (got 'two')",
    "/lookahead": "usage: /lookahead N",
    "/temp 7": "temperature must be between 0 and 5 (got 7.0)",
    "/temp hot": "/temp needs a number (got 'hot')",
    "/top-p 0": "top-p must be in (0, 1] (got 0.0)",
    "/top-p 1.1": "top-p must be in (0, 1] (got 1.1)",
    "/top-k -2": "top-k must be between -1 and 2147483647 (got -2)",
    "/top-k 2.5": "/top-k needs a whole number (got '2.5')",
    "/top-k": "usage: /top-k K",
    "/min-p 1.5": "min-p must be between 0 and 1 (got 1.5)",
    "/min-p nan": "min-p must be between 0 and 1 (got nan)",
    "/typical-p 0": "typical-p must be in (0, 1] (got 0.0)",
    "/typical-p": "usage: /typical-p P",
    "/dry-base 0.5": "dry-base must be between 1 and 100 (got 0.5)",
    "/dry-allowed-length 1.5": "/dry-allowed-length needs a whole number (got '1.5')",
    "/top-n-sigma -2": "top-n-sigma must be between -1 and 100 (got -2.0)",
    "/xtc-probability 1.5": "xtc-probability must be between 0 and 1 (got 1.5)",
    "/xtc-threshold": "usage: /xtc-threshold T",
    "/dynatemp-range 9": "dynatemp-range must be between 0 and 5 (got 9.0)",
    "/mirostat 3": "mirostat must be between 0 and 2 (got 3)",
    "/mirostat 1.5": "/mirostat needs a whole number (got '1.5')",
    "/mirostat-tau -1": "mirostat-tau must be between 0 and 100 (got -1.0)",
    "/mirostat-eta 11": "mirostat-eta must be between 0 and 10 (got 11.0)",
    "/repeat-penalty 0": "repeat-penalty must be in (0, 100] (got 0.0)",
    "/repeat-last-n -2": "repeat-last-n must be between -1 and 2147483647 (got -2)",
    "/presence-penalty 3": "presence-penalty must be between -2 and 2 (got 3.0)",
    "/frequency-penalty": "usage: /frequency-penalty F",
    "/seed -1": "seed must be >= 0 and below 2**63, or 'off' (got -1)",
    "/seed 9223372036854775808": "seed must be >= 0 and below 2**63, or 'off' (got 9223372036854775808)",
    "/load 99999999999999999999": "/load: no conversation 99999999999999999999",
    "/seed on": "/seed needs a whole number (got 'on')",
    "/max-tokens 0": "max-tokens must be between 1 and 32768 (got 0)",
    "/engine": "usage: /engine NAME",
    "/system": "usage: /system TEXT",
    "/json": "usage: /json on|off",
    "/json yes": "/json takes on or off (got 'yes')",
    "/schema": "usage: /schema FILE|off",
    "/schema /specchat-no-such-dir/s.json": "/schema /specchat-no-such-dir/s.json: No such file or directory",
    "/file": "usage: /file PATH",
    "/file /specchat-no-such-dir/x.py": "/file /specchat-no-such-dir/x.py: No such file or directory",
    "/clear all": "this command takes no arguments (got 'all')",
    "/load first": "/load needs a whole number (got 'first')",
    "/frobnicate": "unknown command '/frobnicate': type /help for the list",
    "/": "unknown command '/': type /help for the list",
}


@pytest.mark.parametrize("text", VALID)
def test_valid_commands_parse(text):
    assert parse(text) == VALID[text]


@pytest.mark.parametrize("text", INVALID)
def test_invalid_commands_give_one_line(text):
    with pytest.raises(CommandError) as error:
        parse(text)
    assert str(error.value) == INVALID[text]
    assert "\n" not in str(error.value)


def test_every_command_is_tested_and_in_help():
    tested = {text.split()[0][1:] for text in VALID}
    assert tested == set(commands.COMMANDS)
    lines = commands.help_text().splitlines()
    assert len(lines) == len(commands.SPECS) + 1 and lines[-1] == commands.KEYS_HELP
    for spec, line in zip(commands.SPECS, lines):
        assert line.startswith(spec.usage) and line.endswith(spec.summary)


def test_schema_and_grammar_take_the_replys_form_from_the_file(tmp_path):
    schema, grammar = tmp_path / "reply.json", tmp_path / "answer.gbnf"
    schema.write_text('{"type": "object", "required": ["name"]}')
    grammar.write_text('root ::= "yes" | "no"\n')
    assert parse(f"/schema {schema}") == SetSetting("reply_form", {"type": "object", "required": ["name"]})
    assert parse(f"/grammar {grammar}") == SetSetting("reply_form", 'root ::= "yes" | "no"\n')


def test_the_docs_list_every_command_as_help_shows_it():
    listed = (Path(__file__).resolve().parents[2] / "docs" / "commands.md").read_text()
    assert [spec.usage for spec in commands.SPECS if f"`{spec.usage}`" not in listed] == []


def test_the_keys_help_names_every_key_the_app_and_its_input_bind():
    def shown(key: str) -> str:  # "ctrl+r" as the help writes it: "Ctrl+R"
        return "+".join("Esc" if part == "escape" else part.capitalize() for part in key.split("+"))

    for binding in SpecchatApp.BINDINGS + ChatInput.BINDINGS:
        assert shown(binding.key) in commands.KEYS_HELP, binding.key


def test_a_command_is_a_message_starting_with_a_slash():
    assert commands.is_command("/help") and commands.is_command("/")
    assert not commands.is_command("see /help") and not commands.is_command("")


@pytest.mark.parametrize(
    "candidates, hint",
    [
        (["/stats"], "/stats  figures for the last reply and the session"),
        (["/budget "], "/budget N|auto  draft tree size K; auto: sized every iteration (from the next iteration)"),
        (["/seed ", "/system "], "/seed   /system "),
        (["/engine autoregressive"], "/engine NAME  decoding engine (from the next reply)"),
        ([], "no completion"),
    ],
)
def test_hint_after_tab(candidates, hint):
    assert commands.hint(candidates) == hint


@pytest.mark.parametrize(
    "line, completed, candidates",
    [
        ("/bu", "/budget ", ["/budget "]),
        ("/s", "/s", ["/seed ", "/system ", "/schema ", "/save ", "/stats"]),
        ("/st", "/stats", ["/stats"]),
        ("/lo", "/lo", ["/lookahead ", "/load "]),
        ("/engine a", "/engine autoregressive", ["/engine autoregressive"]),
        ("/engine ", "/engine ", ["/engine specexec", "/engine autoregressive"]),
        ("/seed o", "/seed off", ["/seed off"]),
        ("/fi", "/file ", ["/file "]),
        ("/zz", "/zz", []),
        ("/budget 1", "/budget 1", []),
        ("/budget a", "/budget auto", ["/budget auto"]),
    ],
)
def test_completion(line, completed, candidates):
    assert commands.complete(line, ("specexec", "autoregressive")) == (completed, candidates)


def test_tab_after_file_completes_the_path(tmp_path):
    (tmp_path / "notes.md").write_text("")
    (tmp_path / "notebooks").mkdir()
    line = f"/file {tmp_path}/no"
    assert commands.complete(line, ()) == (f"{line}te", [f"/file {tmp_path}/notebooks/", f"/file {tmp_path}/notes.md"])


def test_settings_reject_out_of_range_and_keep_the_original():
    settings = DecodingSettings()
    with pytest.raises(ValueError, match="between 1 and 256"):
        settings.with_value("depth", 257)
    assert settings.with_value("depth", 256).depth == 256
    assert settings.depth == 24


def test_seed_off_draws_a_fresh_seed_per_reply():
    settings = DecodingSettings(seed=None)
    seeds = {settings.sampling().seed for _ in range(5)}
    assert len(seeds) > 1
    assert DecodingSettings(seed=3).sampling().seed == 3
