"""assemble.py: part files concatenated under a temporary name, made durable, checked, then renamed;
the bar counts bytes in binary units and the callback sees it reach the whole."""

import hashlib
import os

import pytest

from specchat.errors import SpecchatError
from specchat.models import assemble as assemble_module
from specchat.models.assemble import assemble
from specchat.progress import Reporter

PIECES = (b"a" * 1024, b"b" * ((3 << 20) - 1024))  # 3 MiB in all
WHOLE = b"".join(PIECES)
SHA = hashlib.sha256(WHOLE).hexdigest()
QUIET = Reporter(bars=False)


def write_pieces(tmp_path):
    paths = [tmp_path / f"part{index}.bin" for index in range(len(PIECES))]
    for path, piece in zip(paths, PIECES):
        path.write_bytes(piece)
    return paths


def test_the_pieces_are_joined_in_order_under_the_final_name_alone(tmp_path):
    target = tmp_path / "gguf" / "model.gguf"
    assemble(write_pieces(tmp_path), target, len(WHOLE), SHA, "reinstall", QUIET)
    assert target.read_bytes() == WHOLE and os.listdir(target.parent) == ["model.gguf"]


def test_every_byte_is_on_the_disk_before_the_rename(tmp_path, monkeypatch):
    """The rename must not publish a file whose bytes sit in Python's buffer or the page cache."""
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(assemble_module.os, "fsync", lambda fd: synced.append(os.fstat(fd).st_size) or real_fsync(fd))
    target = tmp_path / "model.gguf"
    assemble(write_pieces(tmp_path), target, len(WHOLE), SHA, "reinstall", QUIET)
    assert synced == [len(WHOLE)]


def test_a_wrong_size_names_both_sizes_and_the_remedy(tmp_path):
    target = tmp_path / "model.gguf"
    message = f"assembled model.gguf has {len(WHOLE)} bytes, expected {len(WHOLE) + 1}: reinstall"
    with pytest.raises(SpecchatError, match=f"^{message}$"):
        assemble(write_pieces(tmp_path), target, len(WHOLE) + 1, SHA, "reinstall", QUIET)
    assert sorted(os.listdir(tmp_path)) == ["part0.bin", "part1.bin"]


def test_a_wrong_checksum_names_both_digests_and_the_remedy(tmp_path):
    target = tmp_path / "model.gguf"
    message = f"checksum mismatch for model.gguf (sha256 {SHA[:16]}…, expected {'0' * 16}…): reinstall"
    with pytest.raises(SpecchatError) as raised:
        assemble(write_pieces(tmp_path), target, len(WHOLE), "0" * 64, "reinstall", QUIET)
    assert str(raised.value) == message
    assert sorted(os.listdir(tmp_path)) == ["part0.bin", "part1.bin"]


def test_the_callback_sees_the_assembly_reach_its_whole(tmp_path):
    steps = []
    assemble(write_pieces(tmp_path), tmp_path / "model.gguf", len(WHOLE), SHA, "reinstall",
             Reporter(bars=False, report=lambda text, fraction: steps.append((text, fraction))))
    assert steps[0] == ("assembling model.gguf", 0.0) and steps[-1] == ("assembling model.gguf", 1.0)


def test_the_bar_counts_bytes_in_binary_units(tmp_path, capsys):
    assemble(write_pieces(tmp_path), tmp_path / "model.gguf", len(WHOLE), SHA, "reinstall", Reporter(bars=True))
    drawn = capsys.readouterr().err
    assert "assembling model.gguf" in drawn and "3.00M/3.00M" in drawn and "B/s" in drawn
