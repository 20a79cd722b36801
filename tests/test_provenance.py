"""Which code measured a row: the checkout's commit, or the package version outside git."""

import subprocess

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
