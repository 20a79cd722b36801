"""Reading offloaded weights from disk without the page cache, as a model larger than RAM would be.

Files hold blobs at ALIGN-aligned offsets, padded to ALIGN multiples, so they can be read with
O_DIRECT into ALIGN-aligned buffers. A DirectReader splits each read into chunks read
concurrently by a few threads (os.preadv releases the GIL): one request in flight at a time
leaves the disk idle between requests. Filesystems that refuse O_DIRECT (tmpfs, some network
and overlay filesystems) are read buffered, and each chunk is then dropped from the page cache
with posix_fadvise(DONTNEED).
"""

import errno
import os
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from time import perf_counter

import torch

from specchat.alignment import ALIGN, align_up
from specchat.cuda_device import cuda_usable
from specchat.errors import SpecchatError

MiB = 1 << 20
# Measured on ext4 over virtio (2 GiB file, 256-512 MiB buffers, 10 interleaved runs): 64 MiB x 1
# thread, 64 x 2, 16 x 4, 32 x 4, 8 x 8 and 4 x 16 all read 0.9-1.3 GB/s, within +-8% of each
# other, below the run-to-run noise. The block layer already splits one 64 MiB request into
# max_sectors_kb (4 MiB) pieces queued together; a second thread keeps the next request queued
# so the disk does not idle between two.
CHUNK_BYTES = 64 * MiB
THREADS = 2


def aligned_empty(nbytes: int, pin: bool = False) -> torch.Tensor:
    """An uninitialised uint8 tensor of align_up(nbytes) bytes starting at an ALIGN-aligned address.

    `pin` page-locks it for fast asynchronous host-to-device copies; it is applied only where a GPU
    runs the models (pinning needs the CUDA driver, and without one there is nothing to copy to).
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0 (got {nbytes})")
    size = align_up(nbytes)
    base = torch.empty(size + ALIGN, dtype=torch.uint8, pin_memory=pin and cuda_usable())
    shift = -base.data_ptr() % ALIGN
    return base[shift : shift + size]  # the view shares, and so keeps alive, base's storage


def check_aligned(buffer: torch.Tensor, offset: int) -> None:
    if buffer.device.type != "cpu" or buffer.dtype != torch.uint8 or not buffer.is_contiguous():
        raise ValueError("buffer must be a contiguous CPU uint8 tensor (see aligned_empty)")
    if buffer.data_ptr() % ALIGN:
        raise ValueError(f"buffer address is not {ALIGN}-aligned (allocate it with aligned_empty)")
    if buffer.numel() % ALIGN:
        raise ValueError(f"buffer length {buffer.numel()} is not a multiple of {ALIGN}")
    if offset < 0 or offset % ALIGN:
        raise ValueError(f"file offset {offset} is not a non-negative multiple of {ALIGN}")


class DirectReader:
    """Reads ALIGN-aligned ranges of one file into aligned buffers, bypassing the page cache.

    `direct` tells whether O_DIRECT is in use (False: buffered reads + fadvise DONTNEED).
    """

    def __init__(self, path: Path | str, chunk_bytes: int = CHUNK_BYTES, threads: int = THREADS):
        if chunk_bytes <= 0 or chunk_bytes % ALIGN:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN} (got {chunk_bytes})")
        if threads < 1:
            raise ValueError(f"threads must be >= 1 (got {threads})")
        self.path = Path(path)
        self.chunk_bytes = chunk_bytes
        try:
            self._fd, self.direct = open_uncached(self.path)
        except OSError as error:
            raise SpecchatError(f"cannot open {self.path} for reading: {error.strerror}") from None
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="direct-read")

    def __enter__(self) -> "DirectReader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        os.close(self._fd)

    def read_into(self, buffer: torch.Tensor, offset: int) -> int:
        """Fill all of `buffer` from file `offset`; returns the number of bytes read."""
        return self.read_many([buffer], offset)

    def read_many(self, buffers: list[torch.Tensor], offset: int) -> int:
        """Fill `buffers`, in order, from the contiguous file range starting at `offset`: one
        run of requests for several blobs (each chunk a scatter read that may span two buffers),
        so the disk never waits between blobs. Returns the number of bytes read."""
        for buffer in buffers:
            check_aligned(buffer, offset)
        views = [memoryview(buffer.numpy()) for buffer in buffers]
        size = sum(len(view) for view in views)
        available = os.fstat(self._fd).st_size - offset
        if available < size:
            raise self.short_read(offset, size, max(available, 0))
        chunks = split_chunks(views, self.chunk_bytes)
        futures = [self._pool.submit(self.read_chunk, pieces, offset + start) for start, pieces in chunks]
        wait(futures)  # every chunk has stopped writing into the buffers before any error propagates
        return sum(future.result() for future in futures)

    def read_chunk(self, pieces: list[memoryview], offset: int) -> int:
        wanted = sum(len(piece) for piece in pieces)
        done = 0
        while done < wanted:  # preadv may return early (signals); it returns 0 only at EOF
            try:
                got = os.preadv(self._fd, remaining(pieces, done), offset + done)
            except OSError as error:
                raise SpecchatError(f"cannot read {self.path}: {error.strerror}") from None
            if got == 0:
                raise self.short_read(offset, wanted, done)
            done += got
        if not self.direct:
            os.posix_fadvise(self._fd, offset, done, os.POSIX_FADV_DONTNEED)
        return done

    def short_read(self, offset: int, wanted: int, got: int) -> SpecchatError:
        return SpecchatError(
            f"short read from {self.path}: {got} of {wanted} bytes at offset {offset} (the file is truncated)"
        )


def split_chunks(views: list[memoryview], chunk_bytes: int) -> list[tuple[int, list[memoryview]]]:
    """The buffers' concatenation cut into chunks of `chunk_bytes`: (start, the pieces of the
    buffers it covers). Buffers are ALIGN multiples, so every piece stays aligned."""
    chunks, start, current, room = [], 0, [], chunk_bytes
    for view in views:
        at = 0
        while at < len(view):
            take = min(room, len(view) - at)
            current.append(view[at:at + take])
            at, room = at + take, room - take
            if room == 0:
                chunks.append((start, current))
                start, current, room = start + chunk_bytes, [], chunk_bytes
    if current:
        chunks.append((start, current))
    return chunks


def remaining(pieces: list[memoryview], done: int) -> list[memoryview]:
    """The pieces after the first `done` bytes."""
    out = []
    for piece in pieces:
        if done >= len(piece):
            done -= len(piece)
            continue
        out.append(piece[done:])
        done = 0
    return out


def open_uncached(path: Path) -> tuple[int, bool]:
    """A read-only descriptor for `path`, and whether it uses O_DIRECT.

    Some filesystems refuse O_DIRECT at open, others only at the first read, so one aligned
    block is read to find out; both refusals are EINVAL.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return os.open(path, os.O_RDONLY), False
    try:
        os.preadv(fd, [memoryview(aligned_empty(ALIGN).numpy())], 0)
    except OSError as error:
        os.close(fd)
        if error.errno != errno.EINVAL:
            raise
        return os.open(path, os.O_RDONLY), False
    return fd, True


def evict(path: Path | str) -> None:
    """Drop `path`'s cached pages so the next read comes from the disk.

    Dirty pages are not dropped: fsync a file after writing it, before evicting it.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # length 0: to the end of the file
    finally:
        os.close(fd)


def write_blob(fd: int, data: torch.Tensor, offset: int) -> int:
    """Write `data`'s bytes at `offset` (a multiple of ALIGN), zero-padded to a multiple of ALIGN.

    Buffered: the caller fsyncs once after its last blob. Returns the padded length written.
    """
    if offset < 0 or offset % ALIGN:
        raise ValueError(f"file offset {offset} is not a non-negative multiple of {ALIGN}")
    raw = memoryview(data.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    padding = align_up(len(raw)) - len(raw)
    write_all(fd, raw, offset)
    write_all(fd, memoryview(bytes(padding)), offset + len(raw))
    return len(raw) + padding


def write_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):  # one write moves at most ~2 GiB on Linux
        done += os.pwrite(fd, view[done:], offset + done)


def measure_read_gbps(path: Path, total_bytes: int | None = None, block_bytes: int = 64 * MiB) -> float:
    """Sequential uncached read bandwidth of `path` in GB/s (1e9 bytes), read in `block_bytes` blocks.

    Reads the first `total_bytes` (default: the whole file), rounded down to a multiple of ALIGN.
    """
    evict(path)
    total = (os.path.getsize(path) if total_bytes is None else total_bytes) // ALIGN * ALIGN
    if total <= 0:
        raise ValueError(f"nothing to measure: {path} has fewer than {ALIGN} bytes to read")
    buffer = aligned_empty(min(block_bytes, total))
    with DirectReader(path) as reader:
        start = perf_counter()
        for offset in range(0, total, buffer.numel()):
            reader.read_into(buffer[: min(buffer.numel(), total - offset)], offset)
        seconds = perf_counter() - start
    return total / seconds / 1e9
