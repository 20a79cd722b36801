"""A server the helper starts dies with the process that started it: a parent is killed outright,
as the kernel kills a worker for memory, and its child is gone (or a zombie no one has reaped yet,
where the sandbox's first process does not reap)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WAIT_S = 10
PARENT = """
import subprocess, sys, time
sys.path.insert(0, {tests!r})
from helpers.serve_process import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("\nState:\t")[1][0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_child_is_killed_when_its_parent_is():
    tests = str(Path(__file__).parents[1])
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(tests=tests)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + WAIT_S
    while alive(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)
