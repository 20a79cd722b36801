"""A JSON schema or a grammar read from a file the user named (`generate --json-schema` and
`--grammar`, the chat's /schema): its problems as one line each, the option or command that named
it first."""

import json
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.paths import expanded


def read_schema_file(path: Path, named_by: str) -> dict:
    """The file's JSON object; SpecchatError "`named_by` PATH: why" when it cannot be read or is not one."""
    try:
        schema = json.loads(read_user_file(path, named_by))
    except ValueError as error:  # JSON's errors
        raise SpecchatError(f"{named_by} {shown(path)} is not JSON: {error}") from None
    except RecursionError:
        raise SpecchatError(f"{named_by} {shown(path)}: JSON nested deeper than Python's parser goes") from None
    if not isinstance(schema, dict):
        raise SpecchatError(f"{named_by} {shown(path)}: a JSON schema is an object")
    return schema


def read_user_file(path: Path, named_by: str) -> str:
    """The file's text; SpecchatError "`named_by` PATH: why" when it cannot be read as text."""
    try:
        return expanded(path, named_by).read_text()
    except OSError as error:
        raise SpecchatError(f"{named_by} {shown(path)}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise SpecchatError(f"{named_by} {shown(path)}: not UTF-8 text") from None
    except ValueError:  # a name no file can have (a NUL byte)
        raise SpecchatError(f"{named_by} {str(path)!r}: not a file name") from None


def shown(path: Path) -> str:
    """`path` as a one-line message names it: quoted and escaped where it holds a line break or
    another character that does not print (a pasted name), else as it is."""
    text = str(path)
    return text if text.isprintable() else repr(text)
