"""Turns at the RAM for test modules that xdist workers run side by side.

Each module of the real pair holds gigabytes (the float32 pair alone ~7.9 GB), and several plan
their placement from the RAM available when they load: two of them at once beside a third
worker's could exhaust the machine or change the plans they test. Every such module needs the
same reservation, so the session's RAM makes a number of slots (its budget over one module's
need, at least one), each a lock file beside the workers' temporary directories. A module takes
a free slot, or blocks on one until its holder gives it back: an exclusive flock, which the
kernel also releases when a worker dies, so no worker polls and none waits on a dead one.
"""

import fcntl
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# What one xdist worker holds at most: a module of the real pair, which holds the float32 pair
# (~7.9 GB once loaded, draft first) beside at most ~2 GB of its own; a module holding more frees
# the pair's target first (test_offload_real.py; test_real_exactness.py's int8 copy shares its weights).
REAL_MODULE_RAM = 10 * 2**30  # what a module with real tests reserves: a slot's share of the RAM
RAM_ENV = "SPECCHAT_TEST_RAM"  # the RAM every worker's modules may hold at once, set by the controller
RAM_MARGIN = 2**30  # left out of that: the OS, the controller, the files the workers read


@dataclass(frozen=True)
class RamTurns:
    directory: Path  # shared by every worker of the session
    slots: int  # modules that may hold their RAM at once
    worker: int  # this worker's number: the slot it waits on when none is free

    def try_take(self) -> IO | None:
        """A free slot, held until `give_back`; None when every slot is held."""
        for index in range(self.slots):
            slot = self.open(index)
            try:
                fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                slot.close()
                continue
            return slot
        return None

    def take(self) -> IO:
        """A slot, held until `give_back`: a free one, else this worker's own once its holder leaves."""
        slot = self.try_take()
        if slot is None:
            slot = self.open(self.worker % self.slots)
            fcntl.flock(slot, fcntl.LOCK_EX)
        return slot

    def open(self, index: int) -> IO:
        return (self.directory / f"ram-slot-{index}.lock").open("a")


def give_back(slot: IO) -> None:
    fcntl.flock(slot, fcntl.LOCK_UN)
    slot.close()


def slot_count(budget: int, need: int) -> int:
    """Modules of `need` bytes each that `budget` holds at once; one at least (a module larger
    than the budget still runs, by itself)."""
    return max(1, budget // need)
