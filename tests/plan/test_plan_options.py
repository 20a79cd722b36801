"""plan/options.py: what a run's options ask of the plan. --weights: which form of the target a run
loads (its stored 4-bit weights, packed, or their dense conversion), decided before anything loads,
and carried to every place that loads a target; the links' speeds a pass is predicted with; the
draft's form a described machine is planned with; where the layer file goes. (That `run` and
`doctor` make the same request of the same options: tests/plan/test_plan_request.py.)"""

import re
from pathlib import Path

import pytest
import torch
from helpers.recorded import Recorded

import specchat.loader as loader
from specchat.engine_options import EngineOptions
from specchat.errors import SpecchatError
from specchat.machine_links import Links, save_links
from specchat.models.draft import DraftQuant
from specchat.models.registry import DEFAULT_TARGET
from specchat.paths import cache_dir
from specchat.plan import Machine, draft_quant_for, offload_directory, quantized_weights, resolve_weights
from specchat.plan.options import links_of
from specchat.runtime import validate


@pytest.mark.parametrize("weights,dtype,packed", [("auto", "bfloat16", True), ("auto", "float32", False),
                                                  ("quantized", "float32", True), ("dense", "bfloat16", False)])
def test_the_embedded_target_is_packed_as_weights_and_dtype_say(weights, dtype, packed):
    resolved = resolve_weights(EngineOptions(target=DEFAULT_TARGET, weights=weights, dtype=dtype))
    assert resolved.weights == ("quantized" if packed else "dense") and quantized_weights(resolved) is packed


def test_a_directory_target_has_no_stored_4bit_form(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_weights(EngineOptions(target=str(tmp_path))).weights == "dense"  # auto: dense
    with pytest.raises(SpecchatError, match=rf"^--weights quantized runs a target from the 4-bit weights it stores, "
                                            rf"and {re.escape(str(tmp_path))} stores none that specchat multiplies "
                                            r"packed .*: use --weights dense or auto$"):
        validate(EngineOptions(target=str(tmp_path), weights="quantized"))


@pytest.mark.parametrize("weights,packed", [("auto", True), ("dense", False)])
def test_ray_actors_are_told_the_form(monkeypatch, weights, packed):
    seen = {}

    def record(target, dtype, workers, address, reporter, weights):
        seen["weights"] = weights
        raise Recorded

    monkeypatch.setattr(loader, "build_ray_workers", record)
    options = EngineOptions(target=DEFAULT_TARGET, engine="dsi", weights=weights, ray_address="auto", draft_quant="none")
    with pytest.raises(Recorded):
        loader.load_models(options, progress=False)  # --weights decided once, then carried to the actors
    assert seen == {"weights": "quantized" if packed else "dense"}


def test_an_undecided_weights_choice_is_never_read():
    with pytest.raises(ValueError, match="decided once"):
        quantized_weights(EngineOptions(weights="auto"))


@pytest.fixture
def measured_links(tmp_path, monkeypatch) -> Links:
    """Link speeds doctor measured on this machine, kept in a probe folder of the test's own."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    links = Links(ram_gbps=24.0, disk_gbps=1.3)
    save_links(links)
    return links


def test_this_machine_predicts_with_the_links_doctor_measured_unless_given_its_own(measured_links):
    assert links_of(Machine(kind="cpu")) == measured_links
    assert links_of(Machine(kind="cpu", disk_gbps=2.0)) == Links(measured_links.ram_gbps, 2.0)
    assert links_of(Machine(kind="cpu", pcie_gbps=50.0)) == Links(50.0, measured_links.disk_gbps)


def test_a_described_machine_predicts_with_its_own_links_or_none(measured_links):
    described = Machine(vram_gb=24, ram_gb=64, pcie_gbps=25.0, disk_gbps=3.0)
    assert links_of(described) == Links(25.0, 3.0)
    assert links_of(Machine(vram_gb=24, ram_gb=64)) == Links()  # this machine's links are not its


@pytest.mark.parametrize("machine,auto", [(Machine(vram_gb=24, ram_gb=64), DraftQuant("none")),
                                          (Machine(ram_gb=32), DraftQuant("int8"))], ids=["gpu", "cpu"])
def test_a_described_machine_plans_auto_as_full_weights_on_a_gpu_and_int8_at_every_width_on_a_cpu(machine, auto):
    """Nothing is timed for a described machine: auto is a fixed form there, and an explicit
    --draft-quant is taken as given."""
    assert draft_quant_for(EngineOptions(draft_quant="auto"), machine) == auto
    assert draft_quant_for(EngineOptions(draft_quant="nf4"), machine) == DraftQuant("nf4")


def test_this_cpu_resolves_auto_as_run_does(monkeypatch):
    """Here auto is measured (models/draft.resolve_draft_quant): its answer, whatever it is."""
    seen = []
    monkeypatch.setattr("specchat.plan.options.resolve_draft_quant",
                        lambda kind, device, dtype: seen.append((kind, device, dtype)) or DraftQuant("int8", 4))
    assert draft_quant_for(EngineOptions(draft_quant="auto", dtype="bfloat16"), Machine(kind="cpu")) == \
        DraftQuant("int8", 4)
    assert seen == [("auto", torch.device("cpu"), torch.bfloat16)]


def test_layer_files_go_to_the_offload_dir_given_its_home_expanded_or_to_the_cache():
    assert offload_directory(EngineOptions(offload_dir=None)) == cache_dir() / "offload"
    assert offload_directory(EngineOptions(offload_dir="~/layers")) == Path.home() / "layers"
