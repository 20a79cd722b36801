"""`specchat doctor` lists the choices this machine keeps (quant/widths.py) with the load each was
measured under, and `--measure-again` measures them again."""

import re

import pytest
import torch
from helpers.cli import run_cli

from specchat import machine_choices
from specchat.doctor.choices import choice_lines
from specchat.machine_choices import kept_choices, remembered
from specchat.quant import widths

CPU = torch.device("cpu")
BF16 = {"dtype": "torch.bfloat16"}


@pytest.fixture(autouse=True)
def fresh_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path / "probes"))


def keep(monkeypatch, choice: str, key: dict, value, load: float) -> None:
    """A choice kept as measured under `load` (a stand-in reading)."""
    with monkeypatch.context() as patch:
        patch.setattr(machine_choices, "load_during", lambda measure: (measure(), load))
        remembered(choice, key, CPU, lambda: value)


def test_the_kept_choices_are_listed_with_their_load(monkeypatch):
    keep(monkeypatch, "int8 rows", BF16, 4, 0.6)
    keep(monkeypatch, "prepacked products pay", {**BF16, "rows": 8}, True, 0.02)
    lines = choice_lines(again=False)
    assert lines[0] == ("kept choices (measured once per machine; load: the share of the measurement's time "
                        "spent waiting for a core)")
    assert re.fullmatch(r"  int8 rows +dtype=bfloat16 +4 +load 0\.60; busy .*quiet startup", lines[1])
    assert re.fullmatch(r"  prepacked products pay +dtype=bfloat16 rows=8 +true +load 0\.02", lines[2])


def test_a_machine_that_kept_nothing_says_so():
    assert choice_lines(again=False)[1:] == ["  none yet: the first run that needs one measures it"]


def test_doctor_measures_the_kept_choices_again_and_lists_them(monkeypatch, capsys, tmp_path):
    """On a busy startup (no choice measured again by itself), with stand-ins for the probes the
    plan asks for (the dense copies' crossovers): a plain doctor lists int8's kept rows; with
    --measure-again it measures them now, lists and keeps what it found."""
    keep(monkeypatch, "int8 rows", BF16, 4, 0.6)
    measured = []
    stand_ins = {"int8 rows": lambda dtype: measured.append(dtype) or 64, "int4 dense copy rows": lambda **key: None,
                 "prepacked products pay": lambda dtype: False, "int4 fused widths": lambda **key: [0, "float32"]}
    for choice, stand_in in stand_ins.items():
        monkeypatch.setitem(widths.MEASURES, choice, stand_in)
    monkeypatch.setattr(machine_choices, "load_during", lambda measure: (measure(), 0.01))
    monkeypatch.setattr(machine_choices, "quiet_startup", lambda: False)
    args = ["doctor", "--probe-gb", "0.01", "--offload-dir", str(tmp_path / "offload")]
    code, out, _ = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and re.search(r"^  int8 rows +dtype=bfloat16 +4 +load 0\.60; busy", out, re.M) and not measured
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--measure-again")
    assert code == 0 and re.search(r"^kept choices \(measured again now", out, re.M)
    assert re.search(r"^  int8 rows +dtype=bfloat16 +64 +load 0\.01$", out, re.M)
    assert measured == [torch.bfloat16]
    assert [(kept.value, kept.load) for kept in kept_choices() if kept.choice == "int8 rows"] == [(64, 0.01)]


def test_measure_again_takes_no_described_machine(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "doctor", "--ram-gb", "8", "--measure-again")
    assert code == 2 and out == "" and err.strip().startswith("error: --measure-again measures this machine")
    assert len(err.strip().splitlines()) == 1
