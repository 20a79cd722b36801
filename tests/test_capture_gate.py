"""capture_gate: work blocks run side by side, a capture runs alone, and work arriving while a
capture waits runs after it (DSI's target jobs and the drafter's CUDA captures, capture_gate.py).
The threads' order is read from the gate's own condition, never from the clock: each thread says
when it blocks in the gate and when it has run, so every check sees one or the other."""

import threading

import pytest

from specchat.capture_gate import CaptureGate


HANG = 60  # seconds a thread may take to block or run before the gate is taken to hang (each takes microseconds)


class Signalling(threading.Condition):
    """The gate's condition, releasing `moved` each time a thread blocks on it."""

    def __init__(self, moved: threading.Semaphore) -> None:
        super().__init__()
        self.moved = moved

    def wait(self, timeout: float | None = None) -> bool:
        self.moved.release()
        return super().wait(timeout)


def test_work_runs_side_by_side_and_a_capture_waits_for_it_and_goes_before_later_work():
    moved, log = threading.Semaphore(0), []
    gate = CaptureGate()
    gate.changed = Signalling(moved)

    def run(block, entry: str) -> threading.Thread:
        """`entry` logged inside `block` on a thread of its own, which then releases `moved` too:
        after one `moved.acquire()` the thread has either blocked in the gate or run."""
        def body() -> None:
            try:
                with block():
                    log.append(entry)
            finally:
                moved.release()
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    first, second = gate.work(), gate.work()
    first.__enter__()
    second.__enter__()  # two jobs at once: the second did not wait for the first
    capturing = run(gate.capture, "capture")
    assert moved.acquire(timeout=HANG)
    assert log == [] and gate.waiting == 1  # blocked by the running work, not run
    working = run(gate.work, "late work")
    assert moved.acquire(timeout=HANG)
    assert log == []  # blocked by the waiting capture, not run beside the running work
    first.__exit__(None, None, None)
    assert log == []  # one job still runs: the capture waits on
    second.__exit__(None, None, None)
    capturing.join(timeout=HANG)
    working.join(timeout=HANG)
    assert not capturing.is_alive() and not working.is_alive()  # a gate that never opens fails, not hangs
    assert log == ["capture", "late work"]
    assert (gate.working, gate.capturing, gate.waiting) == (0, False, 0)


def test_a_capture_that_raises_opens_the_gate():
    gate = CaptureGate()
    with pytest.raises(RuntimeError, match="capture failed"), gate.capture():
        raise RuntimeError("capture failed")
    with gate.work():
        assert gate.working == 1 and not gate.capturing
