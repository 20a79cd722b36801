"""Concatenating part files into one file that only gets its final name once size and sha256 match."""

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from specchat.diskspace import check_free_space, disk_full_is_one_line
from specchat.errors import SpecchatError
from specchat.models.staging import new_temp_file
from specchat.progress import Reporter

_CHUNK = 8 << 20  # 8 MiB: large enough that hashing, not syscalls, dominates


def assemble(pieces: list[Path], target: Path, size: int, sha256: str, remedy: str, reporter: Reporter) -> None:
    """Write the concatenation of `pieces` to `target`; on a mismatch raise SpecchatError(... remedy)."""
    check_free_space(target.parent, size, target.name)
    fd, temp = new_temp_file(target)
    try:
        with os.fdopen(fd, "wb") as out, disk_full_is_one_line(target.parent, size, target.name):
            digest = copy_hashing(pieces, out, size, target.name, reporter)
            out.flush()
            os.fsync(out.fileno())  # the rename below must never publish data still in the page cache only
        verify(temp, size, sha256, digest, target.name, remedy)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)  # never leave a partial copy behind, even on Ctrl-C
        raise


def copy_hashing(pieces: list[Path], out: BinaryIO, size: int, label: str, reporter: Reporter) -> str:
    """Copy `pieces` into `out` in order, returning the sha256 hex digest of everything written."""
    digest = hashlib.sha256()
    with reporter.bar(total=size, desc=f"assembling {label}", unit="B", unit_scale=True, unit_divisor=1024) as bar:
        for piece in pieces:
            with piece.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def verify(path: Path, size: int, sha256: str, digest: str, label: str, remedy: str) -> None:
    actual_size = path.stat().st_size
    if actual_size != size:
        raise SpecchatError(f"assembled {label} has {actual_size} bytes, expected {size}: {remedy}")
    if digest != sha256:
        raise SpecchatError(f"checksum mismatch for {label} (sha256 {digest[:16]}…, expected {sha256[:16]}…): {remedy}")
