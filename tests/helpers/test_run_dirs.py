import os
import subprocess
import sys

from helpers.run_dirs import make_run_dir, owner_pid, remove_orphans, running


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_run_dir_carries_this_process_id(tmp_path):
    directory = make_run_dir(tmp_path / "cache", "test-offload-")
    assert directory.parent == tmp_path / "cache" and owner_pid(directory.name, "test-offload-") == os.getpid()


def test_orphans_of_dead_runs_go_and_the_rest_stays(tmp_path):
    dead = tmp_path / f"test-offload-{dead_pid()}-abc"
    alive = tmp_path / f"test-offload-{os.getpid()}-def"
    foreign = tmp_path / "test-offload-w6fc17a9"  # no pid: not ours to judge
    other = tmp_path / "converted"
    for directory in (dead, alive, foreign, other):
        directory.mkdir()
    (dead / "layers").write_bytes(b"x")
    assert remove_orphans(tmp_path, "test-offload-") == [dead]
    assert not dead.exists() and alive.exists() and foreign.exists() and other.exists()


def test_running_tells_live_from_dead_processes():
    assert running(os.getpid()) and not running(dead_pid())
