"""Startup choices measured once per machine and kept in the probe directory."""

import hashlib
import json

import pytest
import torch

from specchat.machine_choices import keyed_path, machine_facts, remembered
from specchat.probe_cache import PROBE_FORMAT, probe_path

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))


def counting(value):
    calls = []

    def measure():
        calls.append(value)
        return value
    return measure, calls


def test_a_choice_is_measured_once_and_then_read():
    measure, calls = counting(32)
    assert remembered("rows", CPU, measure) == 32
    assert remembered("rows", CPU, counting(64)[0]) == 32
    assert calls == [32]


def test_choices_of_other_names_are_measured_apart():
    assert remembered("rows", CPU, lambda: 4) == 4
    assert remembered("other rows", CPU, lambda: None) is None
    assert remembered("rows", CPU, lambda: 8) == 4


def test_another_thread_count_is_another_machine(monkeypatch):
    assert remembered("rows", CPU, lambda: 4) == 4
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    assert remembered("rows", CPU, lambda: 16) == 16


def test_a_damaged_file_is_measured_over(tmp_path):
    remembered("rows", CPU, lambda: 4)
    [kept] = [path for path in tmp_path.iterdir() if path.name.startswith("choice-")]
    kept.write_text("{not json")
    assert remembered("rows", CPU, lambda: 8) == 8
    assert json.loads(kept.read_text()) == {"choice": "rows", "value": 8}
    assert not [path for path in tmp_path.iterdir() if path.name.endswith(".partial")]


def test_the_cost_probes_file_keeps_its_name_from_before_the_shared_key():
    """Users' probed costs stay valid: the name is the first 20 hex digits of the sha256 of the
    sorted JSON key, as it was."""
    models = {"target": "t", "draft": "d"}
    key = {"machine": machine_facts(CPU), "models": models, "format": PROBE_FORMAT}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    assert probe_path(CPU, models).name == f"{digest}.json" == keyed_path("", key).name
