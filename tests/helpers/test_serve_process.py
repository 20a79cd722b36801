"""A server the helper starts dies with the process that started it: a parent is killed outright,
as the kernel kills a worker for memory, and its child has died with it. No clock decides: the
kernel sends the child its SIGKILL while the parent exits, before `wait` returns, so a child that
was killed never runs again, and one that survived answers the release pipe on the death pipe."""

import os
import signal
import subprocess
import sys
from pathlib import Path

# The parent starts the child, says its pid, and blocks on its stdin until it is killed. The child
# waits for a byte on the release pipe, then says "survived" on the death pipe.
PARENT = """
import subprocess, sys
sys.path.insert(0, {tests!r})
from helpers.serve_process import die_with_parent
child = subprocess.Popen([sys.executable, "-c", {child!r}], pass_fds=({release}, {death}), preexec_fn=die_with_parent)
print(child.pid, flush=True)
sys.stdin.read()
"""
CHILD = "import os; os.read({release}, 1); os.write({death}, b'survived')"


def test_the_child_is_killed_when_its_parent_is():
    release_read, release_write = os.pipe()
    death_read, death_write = os.pipe()
    fds = {"release": release_read, "death": death_write}
    script = PARENT.format(tests=str(Path(__file__).parents[1]), child=CHILD.format(**fds), **fds)
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, pass_fds=tuple(fds.values()))
    os.close(release_read)
    os.close(death_write)  # the death pipe's writers are now the parent and the child alone
    try:
        assert int(parent.stdout.readline()) > 0  # the child has started, its death signal set
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            os.write(release_write, b"x")  # a child still alive answers; a killed one never reads it
        except BrokenPipeError:
            pass  # no reader left: the child's end closed already, with its death
        assert os.read(death_read, 16) == b""  # every writer gone: the child died with its parent
    finally:
        os.close(release_write)
        os.close(death_read)
