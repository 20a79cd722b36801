"""Runs a module as `python -m MODULE ARGS...` does, with its stderr watched: just before the line
that announces the RAM plan goes out, the process's own anonymous memory (RssAnon) is written on
a line of its own. That is what the process held when it planned, read before it went on to load:
a parent that reads /proc once the line has reached it reads whatever loading has added since.

usage: python tests/helpers/anon_at_plan.py MODULE [ARGS...]   (tests/real/test_memory_peak_real.py: specchat)
"""

import os
import re
import runpy
import sys
from pathlib import Path
from typing import Any, TextIO

PLANNED = re.compile(r"RAM under --ram-budget [\d.]+ GB: ([\d.]+) GB planned")
# Unanchored: a progress bar may have left the line open ("\r..." and no newline) when it comes.
AT_PLAN = re.compile(r"anonymous memory at the plan: (\d+) bytes")


def anon_bytes(status: Path = Path("/proc/self/status")) -> int | None:
    """The resident anonymous memory (RssAnon) a /proc/<pid>/status reports, in bytes; None once
    the process has gone (the file with it, or, before it is reaped, the line)."""
    try:
        text = status.read_text()
    except OSError:
        return None
    found = re.search(r"^RssAnon:\s+(\d+) kB$", text, re.MULTILINE)
    return None if found is None else int(found.group(1)) * 1024


class PlanWatch:
    """A text stream that passes everything to `stream`, and before the plan's line the reading."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if PLANNED.search(text):
            self.stream.write(f"anonymous memory at the plan: {anon_bytes()} bytes\n")
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty...: the stream's own
        return getattr(self.stream, name)


def main() -> None:
    module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()  # as `python -m` has it: the working directory first, not tests/
    sys.stderr = PlanWatch(sys.stderr)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
