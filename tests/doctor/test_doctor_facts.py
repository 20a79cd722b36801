"""The facts doctor gathers (doctor/facts.py): the probe file's room checked in one line before
anything is measured, the cores and threads psutil may not know, and each GPU torch sees. The
probe and the link measurement are stood in for: their own tests are tests/offload's."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.gpus import seen_gpu

import specchat.doctor.facts as facts
from specchat.alignment import ALIGN, align_up
from specchat.doctor.facts import PROBE_GB_MAX, PROBE_GB_MIN, CudaDevice, cuda_devices, gather, probe_room
from specchat.errors import SpecchatError
from specchat.machine_choices import cpu_identity

GB = 10**9


def test_the_probe_takes_its_bytes_aligned_in_the_folder_it_makes(tmp_path: Path):
    directory, probe_bytes = probe_room(tmp_path / "made", PROBE_GB_MIN)
    assert directory == tmp_path / "made" and directory.is_dir()
    assert probe_bytes == align_up(10**6) and probe_bytes % ALIGN == 0


@pytest.mark.parametrize("probe_gb", [PROBE_GB_MIN / 2, PROBE_GB_MAX * 2, -1.0])
def test_a_probe_size_out_of_range_is_one_line(tmp_path: Path, probe_gb: float):
    with pytest.raises(SpecchatError, match=r"^--probe-gb must be between 0\.001 and 1e\+06 GB \(got "):
        probe_room(tmp_path, probe_gb)


def test_the_largest_probe_size_is_in_range_and_refused_only_for_the_disks_room(tmp_path: Path):
    with pytest.raises(SpecchatError, match="^--probe-gb 1000000.0 needs "):
        probe_room(tmp_path, PROBE_GB_MAX)


def test_a_probe_larger_than_the_free_disk_is_one_line_and_one_that_fills_it_is_taken(monkeypatch, tmp_path: Path):
    free = align_up(2 * GB)  # 2 GB and a few bytes: the probe's bytes are aligned
    monkeypatch.setattr(facts.shutil, "disk_usage", lambda path: SimpleNamespace(free=free))
    with pytest.raises(SpecchatError) as refused:
        probe_room(tmp_path, 2.5)
    assert str(refused.value) == f"--probe-gb 2.5 needs 2.50 GB but {tmp_path} has 2.00 GB free"
    assert probe_room(tmp_path, 2) == (tmp_path, free)  # exactly the free room


def test_an_offload_dir_that_is_a_file_is_named_by_its_option(tmp_path: Path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(SpecchatError, match=f"^--offload-dir {taken} is a file, not a directory$"):
        probe_room(taken, PROBE_GB_MIN)
    with pytest.raises(SpecchatError, match="^--offload-dir ~nobody-here/x: no home directory is known"):
        probe_room(Path("~nobody-here/x"), PROBE_GB_MIN)


def stand_in_for_the_probes(monkeypatch, cpu_counts: dict[bool, int | None]) -> None:
    monkeypatch.setattr(facts, "probe_disk", lambda directory, probe_bytes: (1.5, True))
    monkeypatch.setattr(facts, "measure_h2d_gbps", lambda: None)
    monkeypatch.setattr(facts.psutil, "cpu_count", lambda logical=True: cpu_counts[logical])


def test_doctor_counts_physical_cores_and_logical_threads(monkeypatch, tmp_path: Path):
    stand_in_for_the_probes(monkeypatch, {True: 4, False: 2})
    found = gather(tmp_path, 4096)
    assert (found.cores, found.threads) == (2, 4) and found.cpu == cpu_identity()[0]  # its name, not its flags
    assert (found.disk_gbps, found.direct, found.probe_bytes, found.offload_dir) == (1.5, True, 4096, tmp_path)


def test_counts_psutil_cannot_tell_fall_back_to_the_threads_then_to_one(monkeypatch, tmp_path: Path):
    """psutil answers None where the platform does not say (a container may hide the cores)."""
    for counts, expected in (({True: 4, False: None}, (4, 4)), ({True: None, False: None}, (1, 1))):
        stand_in_for_the_probes(monkeypatch, counts)
        found = gather(tmp_path, 4096)
        assert (found.cores, found.threads) == expected


def test_each_gpu_torch_sees_is_reported_with_its_memory(monkeypatch):
    seen_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"card {index}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: ((index + 1) * GB, 24 * GB))
    assert cuda_devices() == (CudaDevice("card 0", 24 * GB, GB), CudaDevice("card 1", 24 * GB, 2 * GB))
