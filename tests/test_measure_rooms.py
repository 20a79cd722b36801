"""The RAM a CPU plan works with: under a cgroup limit, the limit less what the cgroup uses (the
host's OS lives outside it); under the host's RAM, that less what the OS keeps; a smaller
--ram-budget wins over both."""

from pathlib import Path

import pytest
import torch

import specchat.offload.build as build
from specchat.memory_room import Room
from specchat.offload.budget import OS_RESERVE
from specchat.offload.build import OffloadPlan, measure_rooms

GB = 10**9
CPU = torch.device("cpu")


@pytest.mark.parametrize("room, expected", [
    (Room(2 * GB, "the cgroup v2 limit of 2.50 GB (0.50 GB in use)", limit=True), 2 * GB),
    (Room(20 * GB, "available RAM (20.00 GB)"), 20 * GB - OS_RESERVE),
])
def test_the_os_reserve_applies_only_to_the_hosts_ram(monkeypatch, tmp_path: Path, room, expected):
    monkeypatch.setattr(build, "ram_room", lambda: room)
    rooms = measure_rooms(OffloadPlan(tier="auto", offload_dir=tmp_path), CPU, 0)
    assert rooms.device == expected and room.bound in rooms.device_name


def test_a_smaller_ram_budget_wins(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(build, "ram_room", lambda: Room(2 * GB, "the cgroup v1 limit", limit=True))
    rooms = measure_rooms(OffloadPlan(tier="auto", offload_dir=tmp_path, ram_budget=GB), CPU, 0)
    assert rooms.device == GB and "--ram-budget 1" in rooms.device_name
