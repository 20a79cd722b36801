"""How much RAM this process may still take, and what bounds it: the host's available RAM or a
cgroup memory limit (Docker, Kubernetes and systemd set one) minus what the cgroup already uses.

psutil's available RAM ignores cgroup limits, so a plan made from it alone gets the process
killed (exit 137, no message) in a container. `--ram-budget` is applied by the caller
(`plan/machine.py:measure_rooms`, which also keeps a share of a limit for the page cache)."""

from dataclasses import dataclass
from pathlib import Path

import psutil

from specchat.errors import SpecchatError
from specchat.transfer import gb

# cgroup v1 writes "no limit" as LLONG_MAX rounded down to a page (9223372036854771712 with
# 4 KiB pages), v2 as "max"; a number at or above it is no limit in either.
NO_LIMIT = 9223372036854771712


@dataclass(frozen=True)
class Room:
    """RAM the process may still take, in bytes, and a short human name for what bounds it."""

    bytes: int
    bound: str
    limit: int | None = None  # the cgroup limit that bounds it, in bytes (the host's OS lives outside it); None: the host's RAM


@dataclass(frozen=True)
class Hierarchy:
    """Where one cgroup version keeps a memory controller's files."""

    version: int
    mount: str  # below <root>
    limit: str
    usage: str
    reclaimable: str  # the memory.stat key of the inactive file cache


V2 = Hierarchy(2, "sys/fs/cgroup", "memory.max", "memory.current", "inactive_file")
V1 = Hierarchy(1, "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
               "total_inactive_file")  # total_: the cgroup's and its descendants'


def ram_room(root: Path = Path("/"), available: int | None = None) -> Room:
    """The smallest of the available RAM (psutil's, or `available`) and, at every level of this
    process's memory cgroups, the limit minus that level's working set. `root` is the filesystem
    root the cgroup files are read from (tests point it at a fake tree)."""
    free = psutil.virtual_memory().available if available is None else available
    rooms = [Room(free, f"available RAM ({gb(free)})"), *cgroup_rooms(root)]
    return min(rooms, key=lambda room: room.bytes)


def process_rss() -> int:
    """This process's resident set now, in bytes."""
    return psutil.Process().memory_info().rss


def cgroup_rooms(root: Path) -> list[Room]:
    """One room per limited level of this process's memory cgroups (v2 and v1 alike)."""
    rooms = []
    for hierarchy, path in memory_cgroups(root):
        mount = root / hierarchy.mount
        for directory in levels(mount, path):
            room = level_room(directory, hierarchy)
            if room is not None:
                rooms.append(room)
    return rooms


def memory_cgroups(root: Path) -> list[tuple[Hierarchy, str]]:
    """The memory cgroups /proc/self/cgroup lists: "0::/path" (v2) and "N:memory,...:/path"
    (v1; controllers may be comma-separated); none when the file is missing or unreadable."""
    listing = root / "proc/self/cgroup"
    text = read_text(listing)
    if text is None:
        return []
    found = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        number, controllers, path = fields
        if number == "0" and controllers == "":
            found.append((V2, path))
        elif "memory" in controllers.split(","):
            found.append((V1, path))
    return found


def levels(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount root: a limit set on an ancestor
    binds its descendants. Inside a container the listed path is often missing (the container
    sees its own cgroup at the mount root), so then only the mount root is read."""
    directory = mount / path.lstrip("/")
    if not directory.is_dir():
        return [mount]
    relative = directory.relative_to(mount)
    return [mount / part for part in (relative, *relative.parents)]


def level_room(directory: Path, hierarchy: Hierarchy) -> Room | None:
    """The limit at `directory` minus its working set; None when it sets no limit or its files
    are missing or unreadable.

    The usage counts page cache, which the kernel reclaims before it kills anyone; the inactive
    file cache is subtracted, as docker stats and the kubelet do for their "working set"
    (usage - inactive_file), so a cgroup that has read a large file is not reported full."""
    limit_text = read_text(directory / hierarchy.limit)
    usage_text = read_text(directory / hierarchy.usage)
    if limit_text is None or usage_text is None or limit_text.strip() == "max":
        return None
    limit = parse_int(limit_text, directory / hierarchy.limit)
    if limit >= NO_LIMIT:
        return None
    usage = parse_int(usage_text, directory / hierarchy.usage)
    working_set = max(0, usage - stat_value(directory / "memory.stat", hierarchy.reclaimable))
    return Room(max(0, limit - working_set),
                f"the cgroup v{hierarchy.version} limit of {gb(limit)} ({gb(working_set)} in use)", limit)


def stat_value(stat: Path, key: str) -> int:
    """A "key value" line of a cgroup's memory.stat; 0 when the file or key is absent."""
    text = read_text(stat)
    if text is None:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return parse_int(value, stat)
    return 0


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is missing or unreadable: a cgroup tree we cannot read
    sets no limit we could honour, and is not the user's error."""
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def parse_int(text: str, path: Path) -> int:
    """A number read from `path`, or the one-line error naming the file."""
    try:
        return int(text.strip())
    except ValueError:
        raise SpecchatError(f"cannot read a memory figure from {path}: {text.strip()[:40]!r} is not a number") from None
