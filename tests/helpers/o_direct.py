"""Whether a filesystem reads with O_DIRECT, and whether a descriptor does, found out apart from
`specchat.offload.direct_io`: a test that trusted the reader's own probe would skip, not fail,
when that probe broke."""

import errno
import fcntl
import mmap
import os
from pathlib import Path

BLOCK = 4096  # one page: aligned for O_DIRECT on every filesystem that takes it


def accepts_o_direct(directory: Path) -> bool:
    """True when a file in `directory` opens with O_DIRECT and an aligned block reads from it.
    Some filesystems refuse O_DIRECT at open, others at the first read: both with EINVAL."""
    probe = directory / f"o-direct-probe-{os.getpid()}"
    probe.write_bytes(bytes(BLOCK))
    try:
        return reads_directly(probe)
    finally:
        probe.unlink()


def reads_directly(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return False
    try:
        with mmap.mmap(-1, BLOCK) as buffer:  # anonymous maps start on a page boundary
            os.preadv(fd, [buffer], 0)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return False
    finally:
        os.close(fd)
    return True


def has_o_direct(fd: int) -> bool:
    """Whether the open file description behind `fd` reads with O_DIRECT (its status flags)."""
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
