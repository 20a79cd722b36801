"""Where specchat keeps its files: the cache, and the machine's measurements apart from it."""

from pathlib import Path

from specchat.paths import cache_dir, probe_dir


def test_measurements_live_in_the_cache_unless_placed_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECCHAT_PROBE_DIR")
    assert cache_dir() == tmp_path / "cache" and probe_dir() == tmp_path / "cache" / "probes"
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path / "elsewhere"))
    assert probe_dir() == Path(tmp_path / "elsewhere") and cache_dir() == tmp_path / "cache"


def test_the_suite_keeps_its_measurements_out_of_the_user_cache():
    assert not probe_dir().is_relative_to(cache_dir())
