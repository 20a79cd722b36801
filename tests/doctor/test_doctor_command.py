"""`specchat doctor`'s command: a described machine's figures checked, each named by its option;
this machine planned for the links it measured, and those links kept for the engines."""

import pytest
from helpers.doctor_facts import GB, made_up_facts

import specchat.doctor.command as command
from specchat.doctor.command import check_numbers, run_doctor
from specchat.doctor.facts import CudaDevice, probe_room
from specchat.errors import PlanRefusal, SpecchatError
from specchat.machine_links import Links, read_links
from specchat.plan.machine import Machine

FIGURES = {"vram_gb": "--vram-gb", "ram_gb": "--ram-gb", "disk_gbps": "--disk-gbps", "pcie_gbps": "--pcie-gbps"}


@pytest.mark.parametrize("field", FIGURES)
@pytest.mark.parametrize("value", [0.5, 1e6])  # below 1 GB, and the largest
def test_a_described_figure_in_range_is_taken(field, value):
    check_numbers(Machine(**{field: value}), None, None, None)


@pytest.mark.parametrize("field", FIGURES)
@pytest.mark.parametrize("value", [0.0, -1.0, 1e6 + 0.5])
def test_a_described_figure_out_of_range_is_refused_by_its_options_name(field, value):
    with pytest.raises(SpecchatError) as refused:
        check_numbers(Machine(**{field: value}), None, None, None)
    assert str(refused.value) == f"{FIGURES[field]} must be a positive number up to 1e+06 (got {value})"


def test_this_machine_is_planned_for_the_links_it_measured_and_keeps_them(monkeypatch, capsys, tmp_path):
    """The probe announced on stderr, then the plan made for the measured disk and host-to-device
    speeds (a stand-in that refuses, to see what it was given), and both speeds kept for the engines."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path / "probes"))
    gpu = CudaDevice("Test GPU", 24 * GB, 20 * GB)  # with CUDA: no memory limit is measured
    facts = made_up_facts(cuda=(gpu,), offload_dir=tmp_path / "offload", h2d_gbps=12.5, disk_gbps=1.8)
    probes, planned_for = [], []
    monkeypatch.setattr(command, "gather", lambda directory, size: probes.append((directory, size)) or facts)

    def refuse(options, machine, slots):
        planned_for.append((options.offload_dir, machine, slots))
        raise PlanRefusal("the pair fits nowhere: a stand-in", "device", GB)

    monkeypatch.setattr(command, "doctor_plan", refuse)
    report = run_doctor("t", None, None, Machine(), tmp_path / "offload", 0.01, None, None, False, 3)
    assert capsys.readouterr().err == "measuring (writes, reads and deletes a 0.01 GB probe file)...\n"
    assert probes == [probe_room(tmp_path / "offload", 0.01)]  # its size aligned for O_DIRECT
    assert planned_for == [(str(tmp_path / "offload"), Machine(disk_gbps=1.8, pcie_gbps=12.5), 3)]
    assert read_links() == Links(ram_gbps=12.5, disk_gbps=1.8)
    assert "  fits nowhere   the pair fits nowhere: a stand-in" in report.splitlines()
