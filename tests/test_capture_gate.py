"""capture_gate: work blocks run side by side, a capture runs alone, and work arriving while a
capture waits runs after it (DSI's target jobs and the drafter's CUDA captures, capture_gate.py)."""

import threading
import time

import pytest

from specchat.capture_gate import CaptureGate

SETTLE_S = 0.2  # long enough for an unblocked thread to finish its one append


def until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def started(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_work_runs_side_by_side_and_a_capture_waits_for_it_and_goes_before_later_work():
    gate, log = CaptureGate(), []
    first, second = gate.work(), gate.work()
    first.__enter__()
    second.__enter__()  # two jobs at once: the second did not wait for the first

    def capture() -> None:
        with gate.capture():
            log.append("capture")

    def late_work() -> None:
        with gate.work():
            log.append("late work")

    capturing = started(capture)
    until(lambda: gate.waiting == 1)
    working = started(late_work)
    working.join(SETTLE_S)
    assert working.is_alive() and capturing.is_alive() and log == []  # both held back by the running work
    first.__exit__(None, None, None)
    capturing.join(SETTLE_S)
    assert capturing.is_alive() and log == []  # one job still runs
    second.__exit__(None, None, None)
    capturing.join(10)
    working.join(10)
    assert log == ["capture", "late work"]
    assert (gate.working, gate.capturing, gate.waiting) == (0, False, 0)


def test_a_capture_that_raises_opens_the_gate():
    gate = CaptureGate()
    with pytest.raises(RuntimeError, match="capture failed"), gate.capture():
        raise RuntimeError("capture failed")
    with gate.work():
        assert gate.working == 1 and not gate.capturing
