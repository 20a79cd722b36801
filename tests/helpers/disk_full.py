"""A stand-in for any write that finds the disk full, as the kernel says it."""

import errno
from typing import NoReturn


def disk_full(*args: object, **kwargs: object) -> NoReturn:
    raise OSError(errno.ENOSPC, "No space left on device")
