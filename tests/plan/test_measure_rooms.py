"""The RAM a CPU plan works with: under a cgroup limit, the limit less what the cgroup uses (the
host's OS lives outside it) less PAGE_CACHE_SHARE of the limit for the page cache the run reads
through; under the host's RAM, that less what the OS keeps; a smaller --ram-budget wins over all."""

from collections import namedtuple
from pathlib import Path

import pytest
import torch

import specchat.plan.machine as machine
from specchat.memory_room import Room
from specchat.plan.machine import (OS_RESERVE, PAGE_CACHE_SHARE, Machine, described_rooms, kept_for_page_cache,
                                   measure_rooms, within_budgets)
from specchat.plan.placement import Rooms
from specchat.plan.request import PlanRequest

GB = 10**9
Usage = namedtuple("Usage", "free")  # the field of shutil.disk_usage's answer that the plan reads
CPU = torch.device("cpu")
HOST_RAM = Room(20 * GB, "available RAM (20.00 GB)")  # no cgroup limit: the host's RAM bounds the room


@pytest.mark.parametrize("room, expected", [
    # 2.5 GB limit, 0.5 GB in use: 2 GB left, of which 15% of 2.5 GB (0.375 GB) is kept
    (Room(2 * GB, "the cgroup v2 limit of 2.50 GB (0.50 GB in use)", 5 * GB // 2), 2 * GB - 375 * 10**6),
    (HOST_RAM, 20 * GB - OS_RESERVE),
])
def test_the_os_reserve_applies_to_the_hosts_ram_and_the_page_cache_share_to_a_limit(monkeypatch, tmp_path: Path,
                                                                                      room, expected):
    monkeypatch.setattr(machine, "ram_room", lambda: room)
    rooms = measure_rooms(PlanRequest(tier="auto", offload_dir=tmp_path), CPU, 0)
    assert rooms.device == expected and room.bound in rooms.device_name
    assert PAGE_CACHE_SHARE == 0.15  # the share stated in docs/memory.md and docs/architecture.md


def test_the_rooms_names_say_what_bounds_them_and_what_was_kept(monkeypatch, tmp_path: Path):
    """A plan's refusal quotes these names: each says which memory, and what the plan kept of it."""
    request = PlanRequest(tier="auto", offload_dir=tmp_path)
    monkeypatch.setattr(machine, "ram_room", lambda: HOST_RAM)
    host = measure_rooms(request, CPU, 0)
    assert host.device_name == host.host_name == "RAM (available RAM (20.00 GB), less 1.00 GB for the OS)"
    monkeypatch.setattr(machine, "ram_room", lambda: Room(3 * GB, "the cgroup v2 limit of 4.00 GB", 4 * GB))
    limited = measure_rooms(request, CPU, 0)
    assert limited.device_name == "the cgroup v2 limit of 4.00 GB, less 0.60 GB kept for the page cache"
    assert limited.host is None and limited.host_name == limited.device_name


def test_beside_a_gpu_the_device_is_its_free_memory_and_the_host_its_whole_ram(monkeypatch, tmp_path: Path):
    """The OS reserve is counted against the GPU plan's pinned RAM elsewhere (plan/budget.py), not here."""
    monkeypatch.setattr(machine, "ram_room", lambda: HOST_RAM)
    monkeypatch.setattr(machine, "free_bytes", lambda device: 7 * GB)
    monkeypatch.setattr(machine.shutil, "disk_usage", lambda path: Usage(free=50 * GB))
    rooms = measure_rooms(PlanRequest(tier="auto", offload_dir=tmp_path), torch.device("cuda"), GB)
    assert rooms == Rooms(7 * GB, 20 * GB, 51 * GB, "GPU memory (7.00 GB free)", "RAM (available RAM (20.00 GB))",
                          str(tmp_path))


def test_a_limit_already_spent_leaves_no_room():
    assert kept_for_page_cache(Room(GB // 10, "a cgroup limit", 4 * GB)).bytes == 0  # 0.1 GB left, 0.6 GB kept
    host = Room(GB, "available RAM (1.00 GB)")
    assert kept_for_page_cache(host) is host  # no limit: no page cache share


def test_a_budget_equal_to_the_room_names_the_budget(tmp_path: Path):
    request = PlanRequest(tier="auto", offload_dir=tmp_path, vram_budget_bytes=4 * GB, ram_budget_bytes=8 * GB)
    rooms = within_budgets(Rooms(4 * GB, 8 * GB, GB, "GPU memory (4.00 GB)", "RAM (8.00 GB)"), request)
    assert (rooms.device_name, rooms.host_name) == ("GPU memory under --vram-budget 4 GB",
                                                    "RAM under --ram-budget 8 GB")
    cpu = within_budgets(Rooms(8 * GB, None, GB, "RAM (8.00 GB)"), request)
    assert cpu.device_name == cpu.host_name == "RAM under --ram-budget 8 GB"  # on a CPU the RAM is the device


def test_the_plans_device_is_a_described_machines_a_given_rooms_or_this_machines(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(machine, "cuda_usable", lambda: True)
    given = Rooms(GB, None, GB)
    assert Machine().device().type == "cuda" and Machine(kind="cpu").device().type == "cpu"
    assert Machine(rooms=given).device().type == "cpu"  # a memory limit to run under is a CPU's
    assert Machine(rooms=given).tiers(PlanRequest(tier="auto", offload_dir=tmp_path), 0) is given
    assert Machine(ram_gb=32).described and Machine(vram_gb=24).described and not Machine(rooms=given).described
    monkeypatch.setattr(machine, "cuda_usable", lambda: False)
    assert Machine().device().type == "cpu" and Machine(kind="cuda").device().type == "cuda"
    monkeypatch.setattr(machine, "ram_room", lambda: Room(3 * GB, "available RAM (3.00 GB)"))
    measured = Machine().tiers(PlanRequest(tier="auto", offload_dir=tmp_path), 0)
    assert measured.device == 3 * GB - OS_RESERVE and measured.host is None  # this machine: measured now


def test_a_planned_run_takes_at_most_85_percent_of_its_limit(monkeypatch, tmp_path: Path):
    """Whatever the cgroup already holds, what it holds plus the whole room stays within 85% of the limit."""
    limit = 4 * GB
    for in_use in (0, GB // 2, 3 * GB):
        monkeypatch.setattr(machine, "ram_room", lambda: Room(limit - in_use, "a cgroup limit", limit))
        rooms = measure_rooms(PlanRequest(tier="auto", offload_dir=tmp_path), CPU, 0)
        assert in_use + rooms.device <= 0.85 * limit or rooms.device == 0


def test_a_smaller_ram_budget_wins(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(machine, "ram_room", lambda: Room(2 * GB, "the cgroup v1 limit", 3 * GB))
    rooms = measure_rooms(PlanRequest(tier="auto", offload_dir=tmp_path, ram_budget_bytes=GB), CPU, 0)
    assert rooms.device == GB and "--ram-budget 1" in rooms.device_name


def test_a_reusable_layer_file_counts_as_free_disk_in_the_nearest_existing_folder(monkeypatch, tmp_path: Path):
    """The offload directory need not exist yet: the disk is read where it would be made."""
    monkeypatch.setattr(machine, "ram_room", lambda: HOST_RAM)
    read = []
    monkeypatch.setattr(machine.shutil, "disk_usage", lambda path: read.append(path) or Usage(free=7 * GB))
    offload_dir = tmp_path / "not" / "yet"
    rooms = measure_rooms(PlanRequest(tier="auto", offload_dir=offload_dir), CPU, 2 * GB)
    assert rooms.disk == 9 * GB and read == [tmp_path] and rooms.disk_name == str(offload_dir)


def test_a_described_machine_is_planned_from_its_sizes_alone(tmp_path: Path):
    described = Machine(vram_gb=24, ram_gb=64)
    rooms = described.tiers(PlanRequest(tier="auto", offload_dir=tmp_path), 0)
    assert described.device().type == "cuda" and rooms.device == 24 * GB and rooms.host is not None
    assert Machine(ram_gb=32).device().type == "cpu" and Machine(ram_gb=32).tiers(
        PlanRequest(tier="auto", offload_dir=tmp_path), 0).host is None


def test_a_described_machines_rooms_keep_the_runtimes_1_5_gb_and_on_a_cpu_the_oss_share():
    """What python, torch, transformers and the tokenizer hold is counted on a described machine
    (this one's room is measured with them already in it); on a CPU, whose RAM is the device, the
    OS keeps its share of it too."""
    runtime = 15 * 10**8
    assert described_rooms(24 * GB, 64 * GB) == Rooms(24 * GB, 64 * GB - runtime, 2**62, "GPU memory (24.00 GB)",
                                                       "RAM (64.00 GB, less 1.50 GB for specchat's runtime)",
                                                       "the disk")
    cpu = described_rooms(None, 32 * GB, disk=100 * GB)
    assert cpu == Rooms(32 * GB - runtime - OS_RESERVE, None, 100 * GB,
                        "RAM (32.00 GB, less 1.50 GB for specchat's runtime and 1.00 GB for the OS)",
                        disk_name="the disk")


def test_a_described_machine_honours_the_budgets_too(tmp_path: Path):
    """`doctor --vram-gb 24 --ram-gb 64 --vram-budget 10 --ram-budget 20` plans 10 GB of GPU and
    20 GB of RAM: a budget is never silently ignored."""
    request = PlanRequest(tier="auto", offload_dir=tmp_path, vram_budget_bytes=10 * GB, ram_budget_bytes=20 * GB)
    rooms = Machine(vram_gb=24, ram_gb=64).tiers(request, 0)
    assert (rooms.device, rooms.host) == (10 * GB, 20 * GB)
    assert "--vram-budget 10" in rooms.device_name and "--ram-budget 20" in rooms.host_name
    cpu = Machine(ram_gb=32).tiers(PlanRequest(tier="auto", offload_dir=tmp_path, ram_budget_bytes=4 * GB), 0)
    assert cpu.device == 4 * GB and "--ram-budget 4" in cpu.device_name
    roomy = Machine(ram_gb=32).tiers(PlanRequest(tier="auto", offload_dir=tmp_path, ram_budget_bytes=64 * GB), 0)
    assert roomy.device < 32 * GB and "--ram-budget" not in roomy.device_name  # a budget above the room: the room
