"""The completion marker of a converted directory, kept apart from the converter so that status
checks (e.g. `specchat models`) need not import torch and transformers."""

import json
from pathlib import Path

MARKER = "specchat-converted.json"  # written last, before the rename: its presence means complete
# What a 4-bit conversion holds (models/convert_int4.py): "2" adds the token embedding to the
# linears, "3" the LM head's Q6_K form, "4" every Q6_K linear's, "5" the Q4_K linears' scale parts;
# a directory of another format is converted again.
INT4_FORMAT = "5"


def is_converted(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def is_current_int4(directory: Path) -> bool:
    """A complete 4-bit conversion of this code's format."""
    return is_converted(directory) and json.loads((directory / MARKER).read_text()).get("format") == INT4_FORMAT


def write_marker(directory: Path, record: dict[str, str]) -> None:
    (directory / MARKER).write_text(json.dumps(record, indent=2) + "\n")
