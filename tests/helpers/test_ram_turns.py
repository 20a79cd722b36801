"""The suite's turns at the RAM (tests/helpers/ram_turns.py): how many modules the budget holds, a full
set of slots refusing another, and a blocked worker getting its turn once the holder gives back."""

import threading

from helpers.ram_turns import RamTurns, give_back, slot_count

GB = 2**30


def test_the_budget_holds_whole_modules_and_always_one():
    assert slot_count(21 * GB, 10 * GB) == 2
    assert slot_count(19 * GB, 10 * GB) == 1
    assert slot_count(5 * GB, 10 * GB) == 1  # alone, even past the budget


def test_full_slots_refuse_another_until_one_is_given_back(tmp_path):
    first, second, third = (RamTurns(tmp_path, 2, worker) for worker in range(3))
    held = [first.take(), second.take()]
    assert third.try_take() is None
    give_back(held.pop())
    slot = third.try_take()
    assert slot is not None
    give_back(slot)
    give_back(held.pop())


def test_a_blocked_worker_takes_its_turn_once_the_holder_gives_back(tmp_path):
    holder, waiter, watcher = (RamTurns(tmp_path, 1, worker) for worker in range(3))
    slot = holder.take()
    taken = []
    blocked = threading.Thread(target=lambda: taken.append(waiter.take()))
    blocked.start()
    assert not taken and watcher.try_take() is None  # the holder still has the only slot
    give_back(slot)
    blocked.join()  # returns only once the waiter holds the slot (pytest-timeout guards a hang)
    assert len(taken) == 1 and watcher.try_take() is None  # now the waiter has it
    give_back(taken[0])
