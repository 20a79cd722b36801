"""Temporary siblings for outputs that must appear under their final name only once complete.

A sibling (same directory) makes the final `os.replace`/`os.rename` atomic; the shared hidden
prefix lets a later run, holding the lock, find and delete what an interrupted run left behind.
"""

import tempfile
from pathlib import Path


def temp_prefix(final: Path) -> str:
    return f".{final.name}."


def new_temp_file(final: Path) -> tuple[int, Path]:
    """An open file descriptor and the path of a fresh temporary file next to `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=temp_prefix(final), suffix=".tmp")
    return fd, Path(name)


def new_temp_dir(final: Path) -> Path:
    """A fresh temporary directory next to `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=temp_prefix(final)))


def leftovers(final: Path) -> list[Path]:
    """Temporary siblings of `final` left by earlier runs."""
    if not final.parent.is_dir():
        return []
    return sorted(final.parent.glob(f"{temp_prefix(final)}*"))
