"""The suite's turns at the RAM (tests/ram_turns.py): who may reserve what beside whom, and a
waiting worker getting its turn once the other gives its RAM back."""

import threading
from contextlib import contextmanager

from ram_turns import RamTurns, fits

GB = 2**30


def test_a_reservation_fits_within_the_budget_or_alone():
    assert fits({}, "gw0", 30 * GB, 20 * GB)  # alone, even past the budget
    assert fits({"gw1": 9 * GB}, "gw0", 11 * GB, 20 * GB)
    assert not fits({"gw1": 10 * GB}, "gw0", 11 * GB, 20 * GB)
    assert fits({"gw0": 15 * GB}, "gw0", 11 * GB, 20 * GB)  # a worker's own earlier reservation is replaced


def test_a_waiting_worker_takes_its_turn_once_the_other_gives_back(tmp_path):
    first, second = RamTurns(tmp_path, 20 * GB, "gw0"), RamTurns(tmp_path, 20 * GB, "gw1")
    first.take(15 * GB)
    with first.locked() as held:
        assert held == {"gw0": 15 * GB}
    looked = threading.Event()
    real_locked = second.locked

    def look():  # the second worker's look at the reservations, reported once made
        with real_locked() as held:
            yield held
        looked.set()

    object.__setattr__(second, "locked", contextmanager(look))
    waiting = threading.Thread(target=second.take, args=(10 * GB,))
    waiting.start()
    assert looked.wait(timeout=60)  # it looked and found no room (the timeout only guards a hang)
    with first.locked() as held:
        assert held == {"gw0": 15 * GB}  # it did not take its turn beside the first
    first.give_back()
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    with first.locked() as held:
        assert held == {"gw1": 10 * GB}
