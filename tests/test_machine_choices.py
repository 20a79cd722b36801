"""Startup choices measured once per machine and kept in the probe directory."""

import hashlib
import json
import os

import pytest
import torch

from specchat import machine_choices
from specchat.machine_choices import (BUSY, TASKS, cpu_identity, keyed_path, kept_choices, load_during, machine_facts,
                                      remembered)
from specchat.decoding.autosize import Costs
from specchat.probe_cache import PROBE_FORMAT, probe_path, probed_costs, read_costs

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
    assert remembered("rows", {}, CPU, measure) == 32
    assert remembered("rows", {}, CPU, counting(64)[0]) == 32
    assert calls == [32]


def test_choices_of_other_names_are_measured_apart():
    assert remembered("rows", {}, CPU, lambda: 4) == 4
    assert remembered("other rows", {}, CPU, lambda: None) is None
    assert remembered("rows", {}, CPU, lambda: 8) == 4


def test_another_thread_count_is_another_machine(monkeypatch):
    assert remembered("rows", {}, CPU, lambda: 4) == 4
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    assert remembered("rows", {}, CPU, lambda: 16) == 16


def test_a_cpu_of_other_vector_instructions_is_another_machine(monkeypatch):
    """Two VMs may both call their CPU "AMD EPYC": one with AVX2, one with avx512_bf16."""
    assert remembered("rows", {}, CPU, lambda: 4) == 4
    other = "AVX2" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "AVX512"  # whatever this one is
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    assert remembered("rows", {}, CPU, lambda: 16) == 16


def test_the_cpus_kernel_flags_are_read_from_cpuinfo(tmp_path):
    """torch says AVX512 for an AVX-512 CPU with bf16 instructions and for one without; the flags
    tell them apart."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni sha_ni\n")
    assert cpu_identity(cpuinfo) == ("AMD EPYC", ("avx2", "avx512f", "avx512_vnni", "avx512_bf16"))
    assert machine_facts(CPU)["vectors"][1:] == list(cpu_identity()[1])


def test_a_damaged_file_is_measured_over(tmp_path):
    remembered("rows", {}, CPU, lambda: 4)
    [kept] = [path for path in tmp_path.iterdir() if path.name.startswith("choice-")]
    kept.write_text("{not json")
    assert remembered("rows", {}, CPU, lambda: 8) == 8
    assert json.loads(kept.read_text())["value"] == 8
    assert not [path for path in tmp_path.iterdir() if path.name.endswith(".partial")]


def test_the_cost_probes_file_keeps_its_name_from_before_the_shared_key():
    """Users' probed costs stay valid: the name is the first 20 hex digits of the sha256 of the
    sorted JSON key, as it was."""
    models = {"target": "t", "draft": "d"}
    key = {"machine": machine_facts(CPU), "models": models, "format": PROBE_FORMAT}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    assert probe_path(CPU, models).name == f"{digest}.json" == keyed_path("", key).name


class Startups:
    """Stand-ins for the load readings: each measurement runs under the next of `loads`, and each
    startup is quiet or not as `quiet` says."""

    def __init__(self, monkeypatch, loads: list[float]) -> None:
        self.loads, self.quiet = iter(loads), True
        monkeypatch.setattr(machine_choices, "load_during", lambda measure: (measure(), next(self.loads)))
        monkeypatch.setattr(machine_choices, "quiet_startup", lambda: self.quiet)


def test_a_choice_measured_under_load_is_measured_again_at_the_next_quiet_startup(monkeypatch):
    startups = Startups(monkeypatch, [0.6, 0.0])
    startups.quiet = False
    assert remembered("rows", {}, CPU, lambda: 4) == 4  # beside a build: kept, with its load
    assert remembered("rows", {}, CPU, lambda: 8) == 4  # the build still runs: not measured again
    startups.quiet = True
    assert remembered("rows", {}, CPU, lambda: 16) == 16  # quiet: measured again, and kept
    assert remembered("rows", {}, CPU, lambda: 32) == 16  # measured quiet: kept for good
    [kept] = kept_choices()
    assert (kept.choice, kept.value, kept.load, kept.busy) == ("rows", 16, 0.0, False)


def test_a_measurement_under_more_load_than_the_kept_ones_is_not_kept(monkeypatch):
    Startups(monkeypatch, [0.4, 0.9])
    assert remembered("rows", {}, CPU, lambda: 4) == 4
    assert remembered("rows", {}, CPU, lambda: 8) == 4  # the quiet-looking startup was busier
    assert kept_choices()[0].load == 0.4


def test_the_load_is_the_share_of_the_threads_runnable_time_spent_waiting_for_a_core(monkeypatch):
    # thread 1 ran 100 ns more and waited 100; thread 2 started during it, ran 50 and waited 50
    readings = iter([{"1": (100, 0)}, {"1": (200, 100), "2": (50, 50)}])
    monkeypatch.setattr(machine_choices, "thread_times", lambda: next(readings))
    assert load_during(lambda: "value") == ("value", 0.5)


@pytest.mark.skipif(not TASKS.is_dir(), reason="no /proc/self/task: the load average stands in")
def test_a_real_measurement_reads_its_threads_schedstat():
    value, load = load_during(lambda: sum(range(10**6)))
    assert value == sum(range(10**6)) and 0.0 <= load <= 1.0


def test_the_kept_choices_are_this_machines_by_name_and_key(monkeypatch):
    Startups(monkeypatch, [0.0, 0.0, 0.0])
    threads = torch.get_num_threads()
    remembered("rows", {"dtype": "torch.bfloat16"}, CPU, lambda: 4)
    remembered("pays", {}, CPU, lambda: True)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    remembered("rows", {"dtype": "torch.float32"}, CPU, lambda: 8)  # another thread count: another machine
    assert [(kept.choice, kept.key, kept.value) for kept in kept_choices()] == [("rows", {"dtype": "torch.float32"}, 8)]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert [(kept.choice, kept.value) for kept in kept_choices()] == [("pays", True), ("rows", 4)]


def costs(one_token_s: float) -> Costs:
    return Costs(target_n=(1, 2), target_s=(one_token_s, 2 * one_token_s), draft_b=(1,), draft_s=(0.01,))


def test_costs_probed_under_load_are_probed_again_at_the_next_quiet_startup(monkeypatch):
    """The --budget auto costs follow the kept choices' rule: a one-token pass probed beside a
    build (0.58 s) is not what sizes trees once the machine is quiet."""
    startups = Startups(monkeypatch, [0.5, 0.02])
    path = probe_path(CPU, {"target": "t", "draft": "d"})
    startups.quiet = False
    assert probed_costs(path, lambda: costs(0.58)) == costs(0.58)
    assert probed_costs(path, lambda: costs(0.06)) == costs(0.58)  # still busy: not probed again
    startups.quiet = True
    assert probed_costs(path, lambda: costs(0.06)) == costs(0.06)
    assert probed_costs(path, lambda: costs(0.05)) == costs(0.06)  # probed quiet: kept
    assert read_costs(path) == (costs(0.06), 0.02)


@pytest.mark.parametrize("reprobed_load", [0.9, 0.5])
def test_costs_probed_again_under_as_much_load_or_more_are_not_kept(monkeypatch, reprobed_load):
    Startups(monkeypatch, [0.5, reprobed_load])
    path = probe_path(CPU, {"target": "t", "draft": "d"})
    assert probed_costs(path, lambda: costs(0.58)) == costs(0.58)
    assert probed_costs(path, lambda: costs(0.06)) == costs(0.58)  # the quiet-looking startup was no quieter
    assert read_costs(path) == (costs(0.58), 0.5)


def test_costs_probed_at_the_busy_share_exactly_count_as_probed_under_load(monkeypatch):
    Startups(monkeypatch, [BUSY, 0.0])
    path = probe_path(CPU, {"target": "t", "draft": "d"})
    assert probed_costs(path, lambda: costs(0.58)) == costs(0.58)
    assert probed_costs(path, lambda: costs(0.06)) == costs(0.06)


def test_a_startup_is_quiet_or_not_by_its_first_reading(monkeypatch):
    """Its own loading raises the load average within seconds: read again, a startup that began
    quiet would measure its first busy choice again and not the rest."""
    averages = iter([0.1, 5.0])
    monkeypatch.setattr(os, "getloadavg", lambda: (next(averages), 0.0, 0.0))
    machine_choices.quiet_startup.cache_clear()
    try:
        assert machine_choices.quiet_startup() and machine_choices.quiet_startup()
    finally:
        machine_choices.quiet_startup.cache_clear()
