"""Which code measured a benchmark row, so that rows of different code are never pooled, and
the folder and header a benchmark script's rows go into."""

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import specchat
from specchat.bench.machine import describe_machine


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


def claim_fresh_folder(out: Path) -> None:
    """Create `out` for a script's rows; exit with one line if it already holds anything, so
    that no rerun mixes with or replaces rows kept there."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty: measure into a fresh folder, then compare")
    out.mkdir(parents=True, exist_ok=True)


def table_header(version: str) -> str:
    """When, where, by which code and with which command a script's table was measured."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["python", f"scripts/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    return f"{stamp} · {describe_machine()} · code {version} · `{command}`"
