"""Uncached aligned reads: data round-trips, chunks assemble in order, errors are clear, and the
buffered + fadvise fallback works where O_DIRECT is refused. The tests that claim O_DIRECT read
a file on a filesystem that takes it and check the descriptor's flags: on one that refuses it
the reader falls back silently, and they would prove nothing."""

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers.o_direct import accepts_o_direct, has_o_direct
from helpers.run_dirs import make_run_dir

import specchat.offload.direct_io
from specchat.errors import SpecchatError
from specchat.offload.direct_io import (
    ALIGN,
    DirectReader,
    align_up,
    aligned_empty,
    evict,
    measure_read_gbps,
    write_blob,
)
from specchat.paths import cache_dir

MiB = 1 << 20
TMPFS = Path("/dev/shm")  # refuses O_DIRECT before Linux 6.6


def write_data(directory: Path) -> tuple[Path, torch.Tensor]:
    """A 3 MiB + 2 pages file of random bytes in `directory`, and those bytes."""
    data = torch.randint(0, 256, (3 * MiB + 2 * ALIGN,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    path = directory / "blobs.bin"
    path.write_bytes(data.numpy().tobytes())
    return path, data


@pytest.fixture
def data_file(tmp_path) -> tuple[Path, torch.Tensor]:
    return write_data(tmp_path)


@pytest.fixture(scope="module")
def direct_dir(tmp_path_factory) -> Iterator[Path]:
    """A directory whose filesystem reads with O_DIRECT: the tests' temporary directory, else one
    in /var/tmp, else one in the user cache (where specchat writes its layer file)."""
    tried = [tmp_path_factory.mktemp("direct")]
    if accepts_o_direct(tried[0]):
        yield tried[0]
        return
    for parent in (Path("/var/tmp"), cache_dir()):
        directory = make_run_dir(parent, "test-direct-io-")
        if accepts_o_direct(directory):
            yield directory
            shutil.rmtree(directory)
            return
        shutil.rmtree(directory)
        tried.append(parent)
    pytest.skip(f"no filesystem at hand reads with O_DIRECT (tried {', '.join(map(str, tried))})")


@pytest.fixture
def direct_file(direct_dir) -> tuple[Path, torch.Tensor]:
    """data_file's bytes, on a filesystem that reads them with O_DIRECT; a file of its own per test."""
    return write_data(Path(tempfile.mkdtemp(dir=direct_dir)))


@dataclass(frozen=True)
class Opened:
    """One descriptor the reader opened: what it says (`direct`), what the kernel says (`o_direct`)."""

    direct: bool
    o_direct: bool


@pytest.fixture
def opened(monkeypatch) -> list[Opened]:
    """Every descriptor a DirectReader opens from now on, its flags read as it was opened."""
    real_open_uncached = specchat.offload.direct_io.open_uncached
    record = []

    def recording(path: Path) -> tuple[int, bool]:
        fd, direct = real_open_uncached(path)
        record.append(Opened(direct, has_o_direct(fd)))
        return fd, direct

    monkeypatch.setattr(specchat.offload.direct_io, "open_uncached", recording)
    return record


@pytest.fixture
def refuse_direct(monkeypatch):
    """Make every O_DIRECT open fail with EINVAL, as tmpfs and some other filesystems do."""
    real_open = os.open

    def fake_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", fake_open)


@pytest.fixture
def refusing_file(request, tmp_path) -> tuple[Path, torch.Tensor]:
    """data_file's bytes on a filesystem that refuses O_DIRECT: a tmpfs where the kernel's does,
    else the tests' directory with the refusal simulated."""
    if TMPFS.is_dir() and not accepts_o_direct(TMPFS):
        directory = TMPFS / f"specchat-test-{os.getpid()}-{tmp_path.name}"
        directory.mkdir()
        request.addfinalizer(lambda: shutil.rmtree(directory))
        return write_data(directory)
    request.getfixturevalue("refuse_direct")
    return write_data(tmp_path)


def test_align_up():
    assert [align_up(n) for n in (0, 1, ALIGN, ALIGN + 1)] == [0, ALIGN, ALIGN, 2 * ALIGN]


@pytest.mark.parametrize("nbytes", [1, ALIGN, 3 * ALIGN + 5, MiB])
def test_aligned_empty_is_aligned_and_sized(nbytes):
    buffer = aligned_empty(nbytes)
    assert buffer.dtype == torch.uint8 and buffer.is_contiguous()
    assert buffer.data_ptr() % ALIGN == 0
    assert buffer.numel() == align_up(nbytes)


def test_aligned_empty_pin_without_cuda_still_aligned():
    buffer = aligned_empty(ALIGN, pin=True)
    assert buffer.data_ptr() % ALIGN == 0
    assert buffer.is_pinned() == torch.cuda.is_available()


@pytest.mark.parametrize("offset", [0, ALIGN, MiB])
def test_read_returns_written_bytes_with_o_direct(direct_file, opened, offset):
    path, data = direct_file
    buffer = aligned_empty(MiB + ALIGN)
    with DirectReader(path) as reader:
        assert reader.read_into(buffer, offset) == buffer.numel()
    assert opened == [Opened(direct=True, o_direct=True)]
    assert torch.equal(buffer, data[offset : offset + buffer.numel()])


def test_chunks_assemble_in_order_with_o_direct(direct_file, opened):
    path, data = direct_file
    buffer = aligned_empty(data.numel())
    with DirectReader(path, chunk_bytes=64 * 1024, threads=4) as reader:  # 49 chunks, 4 at a time
        reader.read_into(buffer, 0)
    assert opened == [Opened(direct=True, o_direct=True)]
    assert torch.equal(buffer, data)


def test_fallback_reads_buffered_where_o_direct_is_refused(refusing_file, opened):
    path, data = refusing_file
    buffer = aligned_empty(data.numel())
    with DirectReader(path, chunk_bytes=MiB) as reader:
        reader.read_into(buffer, 0)
    assert opened == [Opened(direct=False, o_direct=False)]
    assert torch.equal(buffer, data)


def test_fallback_when_the_first_direct_read_is_refused(data_file, opened, monkeypatch):
    """Some filesystems accept O_DIRECT at open and refuse it at the first read."""
    path, data = data_file
    real_preadv = os.preadv
    calls = []

    def preadv_refusing_first(fd, buffers, offset):
        calls.append(offset)
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", preadv_refusing_first)
    buffer = aligned_empty(data.numel())
    with DirectReader(path) as reader:
        reader.read_into(buffer, 0)
    assert opened == [Opened(direct=False, o_direct=False)]  # reopened buffered
    assert torch.equal(buffer, data)


def test_misaligned_offset_is_refused(data_file):
    path, _ = data_file
    with DirectReader(path) as reader, pytest.raises(ValueError, match="offset 100 is not"):
        reader.read_into(aligned_empty(ALIGN), 100)


def test_misaligned_buffer_is_refused(data_file):
    path, _ = data_file
    base = aligned_empty(3 * ALIGN)
    with DirectReader(path) as reader:
        with pytest.raises(ValueError, match="length 100 is not a multiple"):
            reader.read_into(base[:100], 0)
        with pytest.raises(ValueError, match="address is not"):
            reader.read_into(base[1 : 1 + ALIGN], 0)
        with pytest.raises(ValueError, match="contiguous CPU uint8"):
            reader.read_into(torch.zeros(ALIGN, dtype=torch.int32), 0)


def test_short_read_is_a_clear_error(data_file):
    path, data = data_file
    with DirectReader(path) as reader, pytest.raises(SpecchatError, match="short read .* truncated"):
        reader.read_into(aligned_empty(2 * MiB), 2 * MiB)


def test_write_blob_pads_to_alignment(tmp_path):
    path = tmp_path / "out.bin"
    first = torch.arange(10, dtype=torch.float32)
    second = torch.arange(3000, dtype=torch.int16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert write_blob(fd, first, 0) == ALIGN
        assert write_blob(fd, second, ALIGN) == 2 * ALIGN
        os.fsync(fd)
    finally:
        os.close(fd)
    evict(path)
    buffer = aligned_empty(3 * ALIGN)
    with DirectReader(path) as reader:
        reader.read_into(buffer, 0)
    assert torch.equal(buffer[:40].view(torch.float32), first)
    assert torch.equal(buffer[ALIGN : ALIGN + 6000].view(torch.int16), second)
    assert not buffer[40:ALIGN].any() and not buffer[ALIGN + 6000 :].any()


def test_write_blob_refuses_misaligned_offset(tmp_path):
    fd = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(ValueError, match="offset 10"):
            write_blob(fd, torch.zeros(4), 10)
    finally:
        os.close(fd)


def test_measure_read_gbps_is_positive_with_o_direct(direct_file, opened):
    path, _ = direct_file
    assert measure_read_gbps(path, block_bytes=MiB) > 0
    assert measure_read_gbps(path, total_bytes=MiB + 100) > 0  # rounded down to whole pages
    assert opened == [Opened(direct=True, o_direct=True)] * 2


def test_measure_read_gbps_is_positive_where_o_direct_is_refused(refusing_file, opened):
    path, _ = refusing_file
    assert measure_read_gbps(path, block_bytes=MiB) > 0
    assert opened == [Opened(direct=False, o_direct=False)]


@pytest.mark.parametrize("chunk_pages", [1, 3, 7, 1000])
def test_read_many_fills_consecutive_buffers_from_one_range_with_o_direct(direct_file, opened, chunk_pages):
    """O_DIRECT refuses a misaligned piece: the straddling chunks' pieces are aligned."""
    path, data = direct_file
    sizes = [5 * ALIGN, 2 * ALIGN, 9 * ALIGN]  # chunks of 3 or 7 pages straddle the buffers' ends
    buffers = [aligned_empty(size) for size in sizes]
    with DirectReader(path, chunk_bytes=chunk_pages * ALIGN) as reader:
        assert reader.read_many(buffers, 2 * ALIGN) == sum(sizes)
    assert opened == [Opened(direct=True, o_direct=True)]
    assert torch.equal(torch.cat(buffers), data[2 * ALIGN: 2 * ALIGN + sum(sizes)])


def test_read_many_resumes_after_short_preadv_returns(data_file, monkeypatch):
    path, data = data_file
    real_preadv = os.preadv

    def at_most_one_page(fd, views, offset):  # as a read interrupted by signals may return
        return real_preadv(fd, [views[0][:ALIGN]], offset)

    buffers = [aligned_empty(3 * ALIGN), aligned_empty(2 * ALIGN)]
    with DirectReader(path) as reader:
        monkeypatch.setattr(os, "preadv", at_most_one_page)
        reader.read_many(buffers, 0)
    assert torch.equal(torch.cat(buffers), data[: 5 * ALIGN])


def test_an_unreadable_file_is_one_line(data_file, monkeypatch):
    path, _ = data_file
    with DirectReader(path) as reader:
        def failing(fd, views, offset):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "preadv", failing)
        with pytest.raises(SpecchatError, match=rf"^cannot read {path}: Input/output error$"):
            reader.read_into(aligned_empty(ALIGN), 0)


def test_a_file_that_cannot_be_opened_is_one_line(tmp_path):
    with pytest.raises(SpecchatError, match=r"^cannot open .*missing\.bin for reading: No such file or directory$"):
        DirectReader(tmp_path / "missing.bin")
