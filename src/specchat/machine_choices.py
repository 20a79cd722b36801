"""Startup measurements that decide how models are stored, measured once per machine and kept.

A CPU-dependent choice is measured, never fixed. Measured at every startup, though, a choice
between two products that run close flips from run to run: up to how many rows the draft's int8
linears beat dense ones read 32 in four of six startups on the AMX Xeon and "every width" in the
other two. Each flip changed the memory plan (the draft's dense weights kept beside its int8
ones: 1.24 GB, or not: 0.53 GB) and the key of `--budget auto`'s cached costs, which were then
probed again (~26 s at startup). Kept in the probe directory under this machine's facts, a choice
is what it was at the last startup, as the cost probe is; removing the directory measures again.

Kept for good, a choice measured while a build shared the cores would stay as that minute found
it (on one machine: prepacked products "did not pay" and the int8 draft won "up to 4 rows", where
measured alone they paid and it won up to 64). So each choice keeps the load it was measured
under (`load_during`: the share of the measurement's runnable time it spent waiting for a core),
and one measured under load (BUSY or more) is measured again at a later quiet startup (the
1-minute load average below QUIET of the cores), kept only if that measurement saw less load.
`specchat doctor` lists the kept choices (`kept_choices`) and can measure them again.
"""

import hashlib
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

import torch

from specchat.paths import probe_dir

Choice = int | float | bool | str | list | None  # what a JSON file holds as it was written
FORMAT = 2  # 2 keeps the load a choice was measured under and its parameters; 1's files are measured over
BUSY = 0.25  # a measurement that waited for a core this share of its runnable time or more was under load
QUIET = 0.5  # a startup is quiet while the 1-minute load average is below this share of the cores
TASKS = Path("/proc/self/task")  # Linux: each thread's schedstat, "cpu_ns wait_ns slices"
Measured = TypeVar("Measured")


CPUINFO = Path("/proc/cpuinfo")
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


@cache
def cpu_identity(cpuinfo: Path = CPUINFO) -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and which of KERNEL_FLAGS it has (Linux's cpuinfo; elsewhere the
    platform's name and none), read once a process: every kept choice's key holds them."""
    if not cpuinfo.exists():
        return platform.processor() or platform.machine(), ()
    lines = cpuinfo.read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    present = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return (names[0] if names else platform.machine()), tuple(flag for flag in KERNEL_FLAGS if flag in present)


def machine_facts(device: torch.device) -> dict:
    """What makes one machine's measurements another's: the CPU, its vector instructions (a VM's
    "AMD EPYC" names both an AVX2 and an avx512_bf16 CPU, whose kernels rank differently; torch
    says AVX512 for both kinds of AVX-512 CPU, the flags tell them apart), its cores and the
    threads torch runs, the GPU, the torch build."""
    cpu, flags = cpu_identity()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    vectors = [torch.backends.cpu.get_cpu_capability(), *flags]
    return {"cpu": cpu, "vectors": vectors, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "gpu": gpu, "torch": torch.__version__}


def keyed_path(stem: str, key: dict) -> Path:
    """A file of the probe directory named by `stem` and a hash of `key`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return probe_dir() / f"{stem}{digest}.json"


def write_atomically(path: Path, text: str) -> None:
    """A concurrent reader (another process starting on the same machine) sees no half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    partial.replace(path)


@dataclass(frozen=True)
class Kept:
    """A choice as kept: its name and parameters, its value, and the load it was measured under."""

    choice: str
    key: dict  # the choice's parameters: a shape, a dtype
    value: Choice
    load: float  # share of the measurement's runnable time spent waiting for a core (0: alone)
    device: str  # the device type it was measured on
    machine: dict  # machine_facts of that device then

    @property
    def busy(self) -> bool:
        return self.load >= BUSY


def choice_path(choice: str, key: dict, device: torch.device) -> Path:
    return keyed_path("choice-", {"machine": machine_facts(device), "choice": choice, "key": key, "format": FORMAT})


def remembered(choice: str, key: dict, device: torch.device, measure: Callable[[], Choice]) -> Choice:
    """The choice `choice` at `key` on this machine: as kept from an earlier startup, else
    `measure()`d now and kept. One kept from a busy measurement is measured again at a quiet
    startup, and the less loaded of the two measurements is kept. A file that does not parse is
    measured over."""
    kept = read_kept(choice_path(choice, key, device))
    if kept is None or (kept.busy and quiet_startup()):
        fresh = measured(choice, key, device, measure)
        if kept is None or fresh.load < kept.load:
            write_kept(fresh)
            kept = fresh
    return kept.value


def measured(choice: str, key: dict, device: torch.device, measure: Callable[[], Choice]) -> Kept:
    """`measure()` now, with the load it ran under."""
    value, load = load_during(measure)
    return Kept(choice, key, value, load, device.type, machine_facts(device))


def write_kept(kept: Kept) -> None:
    path = choice_path(kept.choice, kept.key, torch.device(kept.device))
    write_atomically(path, json.dumps({**asdict(kept), "format": FORMAT}))


def read_kept(path: Path) -> Kept | None:
    """The choice kept at `path`; None where there is none, or it does not parse as this FORMAT's."""
    try:
        fields = json.loads(path.read_text())
        if fields.pop("format") != FORMAT:
            return None
        return Kept(**fields)
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def kept_choices() -> list[Kept]:
    """Every choice kept for this machine (its facts as they are now), by name."""
    found = [read_kept(path) for path in sorted(probe_dir().glob("choice-*.json"))]
    return sorted((kept for kept in found if kept is not None and this_machine(kept)),
                  key=lambda kept: (kept.choice, json.dumps(kept.key, sort_keys=True)))


def this_machine(kept: Kept) -> bool:
    if kept.device == "cuda" and not torch.cuda.is_available():
        return False
    return kept.machine == machine_facts(torch.device(kept.device))


@cache
def quiet_startup() -> bool:
    """Whether this process started on a quiet machine: the 1-minute load average below QUIET of
    the cores when it first asks. Read once: a startup's own loading and measuring raise the
    average (here from 0.94 to over 1 on two cores within seconds), and read again, a startup that
    began quiet measured its first busy choice again and not the rest."""
    return os.getloadavg()[0] < QUIET * (os.cpu_count() or 1)


def load_during(measure: Callable[[], Measured]) -> tuple[Measured, float]:
    """`measure()` and the share of its threads' runnable time spent waiting for a core: what
    other work took from it (Linux's per-thread schedstat; elsewhere the 1-minute load average
    per core at its end, at most 1)."""
    before = thread_times()
    value = measure()
    after = thread_times()
    if after is None or before is None:
        return value, min(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    ran = waited = 0
    for thread, (cpu, wait) in after.items():
        cpu_before, wait_before = before.get(thread, (0, 0))  # a thread started during the measurement
        ran, waited = ran + cpu - cpu_before, waited + wait - wait_before
    return value, waited / (ran + waited) if ran + waited else 0.0


def thread_times() -> dict[str, tuple[int, int]] | None:
    """Each thread's nanoseconds on a core and waiting for one; None without /proc's schedstat."""
    if not TASKS.is_dir():
        return None
    times = {}
    for task in TASKS.iterdir():
        try:
            cpu, wait = (task / "schedstat").read_text().split()[:2]
        except FileNotFoundError:  # the thread ended since the listing: its time no longer counts
            continue
        times[task.name] = (int(cpu), int(wait))
    return times
