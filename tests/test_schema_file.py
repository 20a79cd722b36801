"""A schema file named by `generate --json-schema` or /schema: its object, or one line naming the
option and why (missing, not a file name, not JSON, not an object)."""

from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.schema_file import read_schema_file


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
