"""Turns at the RAM for test modules that xdist workers run side by side.

Each module of the real pair holds gigabytes (the float32 pair alone ~7.5 GB), and several plan
their placement from the RAM available when they load: two of them at once beside a third
worker's could exhaust the machine or change the plans they test. A module therefore reserves
its RAM (tests/conftest.py: REAL_MODULE_GB for a module with real tests) before it starts and gives
it back after its teardown; it waits while the other workers' reservations and its own would
exceed the session's budget, unless no other worker holds any. The reservations are one JSON
file beside the workers' temporary directories, read and written under an exclusive flock.
"""

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

WAIT_S = 0.5  # between looks at the reservations while waiting for a turn (no test's result depends on it)


@dataclass(frozen=True)
class RamTurns:
    directory: Path  # shared by every worker of the session
    budget: int  # bytes every worker's modules may hold at once
    worker: str

    @contextmanager
    def locked(self) -> Iterator[dict[str, int]]:
        """The reservations, under the lock; what the block leaves in the dict is written back."""
        with (self.directory / "ram-turns.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.directory / "ram-turns.json"
            held = json.loads(path.read_text()) if path.exists() else {}
            yield held
            path.write_text(json.dumps(held))

    def take(self, need: int) -> None:
        """Reserve `need` bytes for this worker once they fit."""
        while True:
            with self.locked() as held:
                if fits(held, self.worker, need, self.budget):
                    held[self.worker] = need
                    return
            time.sleep(WAIT_S)

    def give_back(self) -> None:
        with self.locked() as held:
            held.pop(self.worker, None)


def fits(held: dict[str, int], worker: str, need: int, budget: int) -> bool:
    """Whether `worker` may hold `need` beside the others' reservations in `held`: within `budget`,
    or alone (a module larger than the budget still runs, by itself)."""
    others = sum(value for name, value in held.items() if name != worker)
    return others == 0 or others + need <= budget
