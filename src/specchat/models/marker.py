"""The completion marker of a converted directory, kept apart from the converter so that status
checks (e.g. `specchat models`) need not import torch and transformers."""

import json
from pathlib import Path

MARKER = "specchat-converted.json"  # written last, before the rename: its presence means complete


def is_converted(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def write_marker(directory: Path, record: dict[str, str]) -> None:
    (directory / MARKER).write_text(json.dumps(record, indent=2) + "\n")
