"""Which code measured a row: the checkout's commit, or the package version outside git."""

import subprocess

import pytest

from specchat import __version__
from specchat.bench import provenance


def test_a_checkout_gives_its_commit(monkeypatch):
    answers = {"rev-parse": "abc1234", "status": " M src/specchat/cli.py"}
    monkeypatch.setattr(provenance, "git", lambda directory, *args: answers[args[0]])
    assert provenance.code_version() == "abc1234+dirty"
    answers["status"] = ""
    assert provenance.code_version() == "abc1234"


def test_outside_a_checkout_it_is_the_package_version(monkeypatch, tmp_path):
    def not_a_checkout(directory, *args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)

    monkeypatch.setattr(provenance, "git", not_a_checkout)
    assert provenance.code_version() == f"specchat {__version__}"


def test_a_fresh_folder_is_created_and_a_used_one_refused(tmp_path):
    provenance.claim_fresh_folder(tmp_path / "run")
    assert (tmp_path / "run").is_dir()
    provenance.claim_fresh_folder(tmp_path / "run")  # empty: still fresh
    (tmp_path / "run" / "results.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit, match="is not empty: measure into a fresh folder"):
        provenance.claim_fresh_folder(tmp_path / "run")


def test_the_table_header_names_the_code_and_the_command(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/any/where/scripts/bench_peers.py", "--out", "x"])
    header = provenance.table_header("abc1234")
    assert header.endswith(" · code abc1234 · `python scripts/bench_peers.py --out x`")
