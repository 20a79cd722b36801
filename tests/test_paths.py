"""Where specchat keeps its files: the cache, and the machine's measurements apart from it."""

import os
from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.paths import cache_dir, expanded, make_output_dir, output_path, probe_dir


def test_measurements_live_in_the_cache_unless_placed_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECCHAT_PROBE_DIR")
    assert cache_dir() == tmp_path / "cache" and probe_dir() == tmp_path / "cache" / "probes"
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path / "elsewhere"))
    assert probe_dir() == Path(tmp_path / "elsewhere") and cache_dir() == tmp_path / "cache"


def test_the_suite_keeps_its_measurements_out_of_the_user_cache():
    assert not probe_dir().is_relative_to(cache_dir())


def test_an_output_directory_is_made_with_its_parents(tmp_path):
    make_output_dir("--out", tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    make_output_dir("--out", tmp_path / "a" / "b")  # again: already there


@pytest.mark.parametrize(("name", "words"), [("afile", "--out {} is a file, not a directory"),
                                             ("afile/sub", "--out {}: cannot create it: Not a directory")])
def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path, name, words):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SpecchatError) as refused:
        make_output_dir("--out", tmp_path / name)
    assert str(refused.value) == words.format(tmp_path / name)


def test_an_output_directory_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """As a user without write access finds /usr (root may write anywhere, so the check is stood in for)."""
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(SpecchatError) as refused:
        make_output_dir("--out", tmp_path)
    assert str(refused.value) == f"--out {tmp_path}: cannot write there"


def test_a_home_is_expanded_and_a_user_with_none_is_one_line():
    assert expanded("~/notes.json", "/schema") == Path.home() / "notes.json"
    with pytest.raises(SpecchatError) as refused:  # Path.expanduser's RuntimeError, once a traceback
        expanded("~specchat-no-such-user/x", "--offload-dir")
    assert str(refused.value) == ("--offload-dir ~specchat-no-such-user/x: no home directory is known for "
                                  "'~specchat-no-such-user'")


def test_an_output_path_is_named_not_blank_and_its_home_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert output_path("--out", "~/runs") == tmp_path / "runs"
    assert output_path("--out", ".") == Path(".")
    for blank in ("", "  "):
        with pytest.raises(SpecchatError, match=r"^--out is empty: name a directory \('\.' for the current one\)$"):
            output_path("--out", blank)
