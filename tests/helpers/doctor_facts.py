"""A machine's facts as doctor gathers them, made up: what a report or a plan is made from, without
measuring this machine."""

from pathlib import Path

from specchat.doctor.facts import Facts

GB = 10**9


def made_up_facts(**changes) -> Facts:
    """A 2-core CPU machine with 32 GB of RAM and a 1.8 GB/s disk, no GPU; `changes` replace fields."""
    base = dict(
        cpu="Test CPU", cores=2, threads=4, torch_version="2.9.0", cuda=(), unused_gpu=None, ram_total=32 * GB,
        ram_available=20 * GB, offload_dir=Path("/data/offload"), disk_free=100 * GB, h2d_gbps=None,
        disk_gbps=1.8, direct=True, probe_bytes=GB,
    )
    return Facts(**{**base, **changes})
