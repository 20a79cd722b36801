"""`specchat serve` as a user starts it, in a subprocess on a free 127.0.0.1 port, for tests that
drive it with the `openai` client: the first line it prints gives the URL, its log goes to a file
(not a pipe, so that loading bars never block on a full one), and Ctrl+C (SIGINT) stops it when
the block ends, waited for (no clock of its own: the suite's time limit per test bounds it) so
that the test can judge how it stopped. Should the test's process
die first (an xdist worker killed for memory), the kernel kills the server with it: a loaded
server left behind would hold its gigabytes through the rest of the run."""

import ctypes
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


@dataclass
class ServeProcess:
    process: subprocess.Popen
    log: Path
    line: str  # the first line it printed: what it serves, at which URL

    @property
    def url(self) -> str:
        return self.line.split(" at ")[1].split(" ;")[0]

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=api_key, max_retries=0, timeout=None)

    def stopped_cleanly(self) -> bool:
        """After the block: exit status 0 and no traceback in its log."""
        return self.process.returncode == 0 and "Traceback" not in self.log.read_text()


@contextmanager
def serving(log: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[ServeProcess]:
    """`specchat serve --port 0 ARGS` until the block ends; it has loaded when the block starts."""
    with log.open("w") as err:
        process = subprocess.Popen([sys.executable, "-m", "specchat", "serve", "--port", "0", *args], text=True,
                                   stdout=subprocess.PIPE, stderr=err, env=env, preexec_fn=die_with_parent)
    try:
        line = process.stdout.readline()
        assert " at http://127.0.0.1:" in line, line or log.read_text()
        yield ServeProcess(process, log, line)
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate()


def die_with_parent() -> None:
    """In the child before it runs the server (Linux): SIGKILL once the test's process is gone."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
