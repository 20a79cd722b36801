"""Directories a test session makes outside tmp_path, named for the process that made them, so a
later session can remove those of a run that was killed before its teardown (a killed run of the
real tests would otherwise leave gigabytes of layer files in the user's cache)."""

import os
import shutil
import tempfile
from pathlib import Path


def make_run_dir(parent: Path, prefix: str) -> Path:
    """A new directory `<prefix><pid>-<random>` in `parent`, after removing the orphans there."""
    parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(parent, prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def remove_orphans(parent: Path, prefix: str) -> list[Path]:
    """Remove the `prefix` directories whose process no longer runs; returns them. Names without a
    pid are not this module's and stay."""
    removed = []
    for path in parent.glob(f"{prefix}*"):
        pid = owner_pid(path.name, prefix)
        if path.is_dir() and pid is not None and not running(pid):
            shutil.rmtree(path)
            removed.append(path)
    return removed


def owner_pid(name: str, prefix: str) -> int | None:
    head = name.removeprefix(prefix).partition("-")[0]
    return int(head) if head.isdigit() else None


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: it only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
