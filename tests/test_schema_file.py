"""A schema file named by `generate --json-schema` or /schema: its object, or one line naming the
option and why (missing, not a file name, not JSON, not an object)."""

from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.schema_file import read_schema_file, read_user_file


def test_a_schema_file_gives_its_object(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"type": "object"}')
    assert read_schema_file(path, "--json-schema") == {"type": "object"}


@pytest.mark.parametrize(("content", "message"), [
    (None, "--json-schema {path}: No such file or directory"),
    ("{", "--json-schema {path} is not JSON: "),
    ("[1]", "--json-schema {path}: a JSON schema is an object"),
])
def test_a_bad_schema_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SpecchatError) as refused:
        read_schema_file(path, "--json-schema")
    assert str(refused.value).startswith(message.format(path=path)) and "\n" not in str(refused.value)


def test_a_name_no_file_can_have_is_one_line():
    with pytest.raises(SpecchatError, match="not a file name"):
        read_schema_file(Path("\x00"), "/schema")


def test_json_nested_past_pythons_parser_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # json raised RecursionError
    with pytest.raises(SpecchatError, match="JSON nested deeper than Python's parser goes"):
        read_schema_file(path, "/schema")


def test_a_user_without_a_home_is_one_line():
    """Found by the /schema fuzz test: `/schema ~0` raised Path.expanduser's RuntimeError."""
    with pytest.raises(SpecchatError, match="/schema ~0: no home directory is known for '~0'"):
        read_schema_file(Path("~0"), "/schema")


def test_a_name_with_a_line_break_is_named_escaped_on_one_line():
    """Found by the /schema fuzz test: a pasted name holding a line break made a two-line error."""
    with pytest.raises(SpecchatError) as refused:
        read_schema_file(Path("0\n0"), "/schema")
    assert str(refused.value) == "/schema '0\\n0': No such file or directory"


def test_a_grammar_file_gives_its_text_and_bytes_that_are_not_text_are_one_line(tmp_path):
    path = tmp_path / "g.lark"
    path.write_text('start: "a"\n')
    assert read_user_file(path, "--grammar") == 'start: "a"\n'
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(SpecchatError, match=r"^--grammar .*: not UTF-8 text$"):
        read_user_file(path, "--grammar")
