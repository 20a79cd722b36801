"""Which code measured a benchmark row, so that rows of different code are never pooled."""

import subprocess
from pathlib import Path

import specchat


def code_version() -> str:
    """The commit of the checkout specchat runs from, with "+dirty" when its tracked files differ
    from it; `specchat <version>` for an installed copy outside a git checkout."""
    source = Path(__file__).resolve().parent
    try:
        head = git(source, "rev-parse", "--short", "HEAD")
        dirty = git(source, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout
        return f"specchat {specchat.__version__}"
    return head + ("+dirty" if dirty else "")


def git(directory: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, check=True).stdout.strip()
