"""Fuzzing the slash-command parser and the settings' validation with hypothesis: whatever is
typed, parsing either gives a command whose values pass validation or refuses with one line."""

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.tui import commands
from specchat.tui.commands import CommandError, SetSetting
from specchat.tui.settings import DecodingSettings, problem

NAMES = [spec.name for spec in commands.SPECS] + ["", "bogus", "BUDGET"]
ARGUMENTS = st.one_of(
    st.text(max_size=40),
    st.integers(-10**12, 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["auto", "off", "AUTO", "Off", " 12 ", "1e3", "0x10", "-0", "nan", "inf", "１２"]),
)
TYPED = st.builds(lambda name, space, argument: f"/{name}{space}{argument}",
                  st.sampled_from(NAMES), st.sampled_from(["", " ", "  ", "\t"]), ARGUMENTS)


def one_line(message: str) -> bool:
    return bool(message.strip()) and "\n" not in message and "Traceback" not in message


@settings(max_examples=1500, deadline=None)
@given(TYPED)
def test_any_typed_command_parses_or_is_refused_in_one_line(text):
    try:
        command = commands.parse(text)
    except CommandError as error:
        assert one_line(str(error)), repr(str(error))
        return
    if isinstance(command, SetSetting) and command.field not in ("engine", "system_prompt"):
        assert problem(command.field, command.value) is None
        DecodingSettings().with_value(command.field, command.value)  # what the session stores


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(["budget", "depth", "lookahead", "max_tokens", "temperature", "top_p", "seed"]),
       st.one_of(st.integers(-10**9, 10**9), st.floats(allow_nan=False, allow_infinity=True), st.none(),
                 st.just("auto")))
def test_settings_accept_or_explain_in_one_line(field, value):
    if value is None and field != "seed" or value == "auto" and field != "budget":
        return  # values no parser produces for these fields
    message = problem(field, value)
    if message is None:
        assert DecodingSettings().with_value(field, value) is not None
    else:
        assert one_line(message), repr(message)


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=string.printable + "é→", max_size=30))
def test_completion_never_fails_and_extends_the_line(text):
    line = "/" + text
    completed, candidates = commands.complete(line, ("specexec", "autoregressive"))
    assert completed.startswith(line) and all(c.startswith(completed) for c in candidates)
