"""The results file of a benchmark: one JSON row per (prompt, configuration), appended as measured."""

import json
from pathlib import Path

from specchat.errors import SpecchatError

RESULTS_FILE = "results.jsonl"

# What identifies a measurement: a rerun skips rows whose key is already in the file.
KEY_FIELDS = (
    "engine", "budget", "temperature", "top_p", "seed", "dataset", "prompt_index", "max_new_tokens",
    "target", "draft", "dtype", "offload", "workers", "weights",
)


def row_key(row: dict) -> tuple:
    # .get: rows written before a field existed lack it, and it was None for them
    return tuple(row.get(field) for field in KEY_FIELDS)


def drop_partial_line(path: Path) -> None:
    """Cut an unfinished last line (a run interrupted mid-write), so that rows appended next start
    on a line of their own."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def read_rows(path: Path) -> list[dict]:
    """The complete rows of `path` (none if it does not exist yet)."""
    if not path.exists():
        return []
    drop_partial_line(path)
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise SpecchatError(f"{path} is not UTF-8 text, so not a results file: fix or delete it") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise SpecchatError(f"{path} line {number} is not a JSON row ({error.msg}): fix or delete it") from error
        if not isinstance(row, dict):
            raise SpecchatError(f"{path} line {number} is not a JSON object, so not a row: fix or delete it")
        rows.append(row)
    return rows


def append_row(path: Path, row: dict) -> None:
    """Append `row`; the file is closed (so flushed) after each one, and an interrupted sweep keeps
    every finished row."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
