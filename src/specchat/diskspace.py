"""Room for large writes (the layer file, converted weights, an assembled GGUF): checked before
writing, and a disk that fills up anyway reported in one line naming the space needed."""

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.transfer import gb


def check_free_space(directory: Path, needed: int, what: str) -> None:
    """Raise the one-line error when `directory`'s filesystem (that of its nearest existing
    ancestor, if it is still to be made) has less than `needed` bytes free."""
    existing = next(path for path in (directory, *directory.parents) if path.exists())
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise SpecchatError(f"not enough space in {directory} for {what}: it needs {gb(needed)}, {gb(free)} are free")


@contextmanager
def disk_full_is_one_line(directory: Path, needed: int, what: str) -> Iterator[None]:
    """Turn ENOSPC (no space left) or EDQUOT (quota) inside the block into the one-line error;
    the caller removes what it had written."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SpecchatError(f"the disk holding {directory} filled up while writing {what}: it needs "
                            f"{gb(needed)} free") from None
