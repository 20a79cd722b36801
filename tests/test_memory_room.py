"""The room the process may take: fake cgroup v1 and v2 trees under tmp_path, and the real machine."""

from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from specchat.errors import SpecchatError
from specchat.memory_room import Room, process_rss, ram_room
from specchat.transfer import gb

GB = 10**9
AVAILABLE = 20 * GB  # what the fake host says it has free
V1_UNLIMITED = (2**63 - 1) // 4096 * 4096  # what cgroup v1 writes for no limit: LLONG_MAX rounded down to a 4 KiB page


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_level(directory: Path, limit: int | str, current: int, inactive_file: int = 0) -> None:
    write(directory / "memory.max", f"{limit}\n")
    write(directory / "memory.current", f"{current}\n")
    write(directory / "memory.stat", f"anon {current - inactive_file}\ninactive_file {inactive_file}\nactive_file 0\n")


def v1_level(directory: Path, limit: int, usage: int, inactive_file: int = 0) -> None:
    write(directory / "memory.limit_in_bytes", f"{limit}\n")
    write(directory / "memory.usage_in_bytes", f"{usage}\n")
    write(directory / "memory.stat", f"inactive_file 0\ntotal_inactive_file {inactive_file}\n")


def v2_tree(root: Path, path: str = "/app.slice/job") -> Path:
    write(root / "proc/self/cgroup", f"0::{path}\n")
    return root / "sys/fs/cgroup"


def v1_tree(root: Path, path: str = "/docker/abc", controllers: str = "memory") -> Path:
    write(root / "proc/self/cgroup", f"9:name=systemd:/\n4:{controllers}:{path}\n1:cpu:/\n0::/\n")
    return root / "sys/fs/cgroup/memory"


def test_a_v2_limit_binds_and_is_named(tmp_path):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(2 * GB), GB // 2)
    room = ram_room(tmp_path, available=AVAILABLE)
    assert room == Room(3 * GB // 2, "the cgroup v2 limit of 2.00 GB (0.50 GB in use)", 2 * GB)


def test_v2_max_is_no_limit(tmp_path):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", "max", GB)
    assert ram_room(tmp_path, available=AVAILABLE) == Room(AVAILABLE, "available RAM (20.00 GB)")


def test_a_v2_ancestor_limit_binds_with_its_own_usage(tmp_path):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(8 * GB), GB)  # 7 GB of room here
    v2_level(mount / "app.slice", str(4 * GB), 3 * GB)  # but the slice's other jobs leave 1 GB
    v2_level(mount, "max", 10 * GB)
    room = ram_room(tmp_path, available=AVAILABLE)
    assert room == Room(GB, "the cgroup v2 limit of 4.00 GB (3.00 GB in use)", 4 * GB)


def test_v2_inactive_file_cache_is_not_in_use(tmp_path):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(2 * GB), current=GB + GB // 2, inactive_file=GB)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == 2 * GB - GB // 2


def test_an_inactive_file_cache_above_the_usage_leaves_the_whole_limit(tmp_path):
    """memory.current and memory.stat are read at different moments: the cache may exceed the usage."""
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(2 * GB), current=GB, inactive_file=GB + GB // 4)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == 2 * GB


def test_a_cgroup_path_holding_a_colon_is_read_whole(tmp_path):
    mount = v2_tree(tmp_path, "/kubepods/pod:1/ctr")
    v2_level(mount / "kubepods/pod:1/ctr", str(GB), GB // 10)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == GB - GB // 10


def test_a_v1_limit_binds_with_comma_separated_controllers(tmp_path):
    mount = v1_tree(tmp_path, controllers="memory,hugetlb")
    v1_level(mount / "docker/abc", 2 * GB, GB // 4)
    room = ram_room(tmp_path, available=AVAILABLE)
    assert room == Room(2 * GB - GB // 4, "the cgroup v1 limit of 2.00 GB (0.25 GB in use)", 2 * GB)


def test_v1_page_rounded_llong_max_is_no_limit(tmp_path):
    mount = v1_tree(tmp_path)
    v1_level(mount / "docker/abc", V1_UNLIMITED, GB)
    v1_level(mount, V1_UNLIMITED, 5 * GB)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == AVAILABLE


def test_v1_total_inactive_file_is_not_in_use(tmp_path):
    mount = v1_tree(tmp_path)
    v1_level(mount / "docker/abc", 2 * GB, usage=GB, inactive_file=GB // 2)
    room = ram_room(tmp_path, available=AVAILABLE)
    assert room == Room(2 * GB - GB // 2, "the cgroup v1 limit of 2.00 GB (0.50 GB in use)", 2 * GB)


def test_a_v1_ancestor_limit_binds(tmp_path):
    mount = v1_tree(tmp_path)
    v1_level(mount / "docker/abc", V1_UNLIMITED, GB)
    v1_level(mount / "docker", 3 * GB, 2 * GB)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == GB


@pytest.mark.parametrize("tree, level", [(v1_tree, v1_level), (v2_tree, v2_level)])
def test_a_missing_cgroup_path_falls_back_to_the_mount_root(tmp_path, tree, level):
    """In a container /proc/self/cgroup names the host's path; the container's own cgroup is
    mounted at the root."""
    mount = tree(tmp_path, "/kubepods/pod1/ctr")
    level(mount, GB, GB // 10)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == GB - GB // 10


def test_a_usage_above_the_limit_leaves_no_room(tmp_path):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(GB), 2 * GB)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == 0


def test_available_ram_binds_when_smaller_than_the_limit(tmp_path):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(64 * GB), GB)
    assert ram_room(tmp_path, available=AVAILABLE).bound == "available RAM (20.00 GB)"


def test_no_cgroup_file_means_available_ram(tmp_path):
    assert ram_room(tmp_path, available=AVAILABLE) == Room(AVAILABLE, "available RAM (20.00 GB)")


def test_missing_files_set_no_limit_at_their_level(tmp_path):
    mount = v2_tree(tmp_path)
    write(mount / "app.slice/job/memory.max", f"{GB}\n")  # no memory.current beside it
    assert ram_room(tmp_path, available=AVAILABLE).bytes == AVAILABLE


@pytest.mark.parametrize("stat", [None, f"anon {GB}\nactive_file 0\n"], ids=["no-file", "no-inactive-file"])
def test_a_missing_stat_file_or_key_subtracts_nothing(tmp_path, stat):
    mount = v2_tree(tmp_path)
    write(mount / "app.slice/job/memory.max", f"{2 * GB}\n")
    write(mount / "app.slice/job/memory.current", f"{GB}\n")
    if stat is not None:
        write(mount / "app.slice/job/memory.stat", stat)
    assert ram_room(tmp_path, available=AVAILABLE).bytes == GB


@pytest.mark.parametrize("name, text", [("memory.max", "two gigs"), ("memory.current", ""),
                                        ("memory.stat", "inactive_file lots\n")])
def test_a_malformed_number_is_one_line_naming_the_file(tmp_path, name, text):
    mount = v2_tree(tmp_path)
    v2_level(mount / "app.slice/job", str(2 * GB), GB)
    write(mount / "app.slice/job" / name, text)
    with pytest.raises(SpecchatError) as error:
        ram_room(tmp_path, available=AVAILABLE)
    message = str(error.value)
    assert "\n" not in message and str(mount / "app.slice/job" / name) in message


def test_the_real_machine_has_room_no_larger_than_available_ram():
    """This machine's cgroup files, read as they are. Available RAM is read once and handed in:
    two reads of it differ by whatever other jobs did in between."""
    available = psutil.virtual_memory().available
    room = ram_room(available=available)
    assert 0 < room.bytes <= available
    if room.bytes == available:
        assert room.bound == f"available RAM ({gb(available)})"
    else:
        assert room.limit  # a cgroup's limit binds


def test_by_default_available_ram_is_psutils(tmp_path, monkeypatch):
    """What ram_room reads when not handed a figure: psutil's, at the call (no cgroup here)."""
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=AVAILABLE))
    assert ram_room(tmp_path) == Room(AVAILABLE, "available RAM (20.00 GB)")


def test_resident_sets_are_measured():
    ballast = b"\x01" * (64 * 2**20)  # written, so resident (a zeroed bytearray may be untouched pages)
    now = process_rss()
    assert now > len(ballast)
    del ballast
