"""plan/request.py. `run` and `doctor` ask the plan the same thing for the same options: the pair
(the target's weights, the draft's forms, the int8 draft's dense copies) and the request (tier,
budgets, trees, the target's dense copies) that reach `plan_pair` from `loader.load_models` and from
doctor's plan are equal, on this machine's CPU and on a described GPU machine. The trees a request
plans room for, and what its options ask of the placement."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.gpus import seen_gpu
from helpers.recorded import Recorded

import specchat.doctor.plan as doctor_module
import specchat.loader as loader
import specchat.models.draft as draft_module
import specchat.plan.pair as pair_module
from specchat.doctor.plan import doctor_options, doctor_plan
from specchat.engine_options import EngineOptions
from specchat.machine_links import Links, read_links
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.plan import Machine, PlanRequest
from specchat.plan.placement import Request
from specchat.plan.request import tree_sizes

INT8_ROWS = 4  # the int8 draft's crossover this machine is taken to have measured: dense copies above it


@pytest.fixture(autouse=True)
def offline(monkeypatch) -> None:
    """From the shipped configs; the int8 crossover as if measured here (machine_choices keeps one
    per machine: the test must not depend on which)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(draft_module, "int8_rows", lambda dtype: INT8_ROWS)


def asked(module, monkeypatch, call) -> tuple:
    """The (pair, request) `call` hands `module.plan_pair`."""
    seen = []

    def record(pair, request, machine):
        seen.append((pair, request))
        raise Recorded

    monkeypatch.setattr(module, "plan_pair", record)
    with pytest.raises(Recorded):
        call()
    return seen[0]


def run_asks(monkeypatch, options: EngineOptions) -> tuple:
    return asked(loader, monkeypatch, lambda: loader.load_models(options, progress=False))


def doctor_asks(monkeypatch, options: EngineOptions, machine: Machine) -> tuple:
    return asked(doctor_module, monkeypatch, lambda: doctor_plan(options, machine))


CPU_CASES = {  # doctor's options: target, draft, context, --ram-budget
    "a dense target in memory": ("qwen3-1.7b", "qwen3-0.6b", None, None),
    "a 4-bit target and the int8 draft": (DEFAULT_TARGET, DEFAULT_DRAFT, None, None),
    "the disk tier under --ram-budget": (DEFAULT_TARGET, DEFAULT_DRAFT, 2048, 1.5),
    "no draft": (DEFAULT_TARGET, None, None, None),
}


@pytest.mark.parametrize("case", CPU_CASES)
def test_run_and_doctor_ask_the_same_of_this_cpu(monkeypatch, tmp_path: Path, case):
    target, draft, context, ram_budget = CPU_CASES[case]
    options = doctor_options(target, draft, context, tmp_path, ram_budget)
    run_pair, run_request = run_asks(monkeypatch, options)
    pair, request = doctor_asks(monkeypatch, options, Machine())
    assert (pair.weights, pair.draft_kinds, pair.dense_above) == (run_pair.weights, run_pair.draft_kinds,
                                                                  run_pair.dense_above)
    assert request.dense_copies == run_request.dense_copies
    assert (pair, request) == (run_pair, run_request)
    quantized = target == DEFAULT_TARGET
    assert pair.weights == ("quantized" if quantized else "dense") and request.dense_copies is quantized
    assert pair.draft_kinds == (("none",) if draft is None else ("int8",))
    assert pair.dense_above == (None if draft is None else INT8_ROWS)  # the copies run keeps, doctor plans too
    assert request.ram_budget_bytes == (None if ram_budget is None else int(ram_budget * 1e9))


def test_run_on_a_gpu_asks_what_doctor_asks_of_a_described_one(monkeypatch, tmp_path: Path):
    """A described GPU machine is taken to have bitsandbytes: run there weighs int4 and nf4 beside
    full weights, and a GPU keeps no dense copies. Run times each form's step on its own GPU, and
    weighs fp8 where that GPU multiplies it; a described one cannot be timed, nor its fp8 units
    known, and its links are its own (run reads what doctor last measured here)."""
    monkeypatch.setattr(pair_module, "has_bitsandbytes", lambda: True)
    monkeypatch.setattr(pair_module, "fp8_runs_on", lambda device: device.type == "cuda")
    seen_gpu(monkeypatch)  # run checks --vram-budget has a GPU
    monkeypatch.setattr(loader, "pick_device", lambda: torch.device("cuda"))
    options = doctor_options("llama-2-70b-gptq", "llama-2-7b", None, tmp_path, 60.0, 20.0)
    run = run_asks(monkeypatch, options)
    pair, request = doctor_asks(monkeypatch, options, Machine(vram_gb=24, ram_gb=64))
    assert run[0].measure_steps and not pair.measure_steps
    assert request.links == Links() and run[1].links == read_links()
    assert run[0].draft_kinds == ("none", "int4", "nf4", "fp8")
    assert (replace(pair, measure_steps=True, draft_kinds=run[0].draft_kinds), replace(request, links=run[1].links)) == run
    assert pair.draft_kinds == ("none", "int4", "nf4") and pair.dense_above is None and not request.dense_copies
    assert request.vram_budget_bytes == 20 * 10**9


def test_the_largest_pass_is_autos_cap_or_a_larger_budget_and_auto_falls_back_only_above_a_budget():
    """A pass scores its tree and its root: --budget auto's cap streamed (1024 on a CPU, 2048 on a
    GPU) halves down to 128; a --budget given is never planned smaller, and beyond the cap it is
    the largest pass itself."""
    assert tree_sizes(cuda=False) == (1025, (513, 257, 129))
    assert tree_sizes(cuda=True) == (2049, (1025, 513, 257, 129))
    assert tree_sizes(cuda=False, budget=300) == (1025, (513,))
    assert tree_sizes(cuda=False, budget=512) == (1025, (513,))  # 512 nodes and the root: a pass of 513
    assert tree_sizes(cuda=False, budget=513) == (1025, ())
    assert tree_sizes(cuda=False, budget=1024) == (1025, ())
    assert tree_sizes(cuda=False, budget=1500) == (1501, ())


def test_offload_none_keeps_every_layer_resident_and_the_others_pass_through(tmp_path: Path):
    none = PlanRequest(tier="none", offload_dir=tmp_path, resident_layers=3, slots=2).placement_request(80)
    assert none == Request("auto", resident_layers=80, slots=2)
    disk = PlanRequest(tier="disk", offload_dir=tmp_path, resident_layers=3, slots=2).placement_request(80)
    assert disk == Request("disk", resident_layers=3, slots=2)
