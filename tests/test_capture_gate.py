"""capture_gate: work blocks run side by side, a capture runs alone, and work arriving while a
capture waits or runs goes after it, woken by its end (DSI's target jobs and the drafter's CUDA
captures, capture_gate.py).
The threads' order is read from the gate's own condition, never from the clock: each thread says
when it blocks in the gate and when it has run, so every check sees one or the other."""

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

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


def run(block: Callable[[], AbstractContextManager], entry: str, log: list[str], moved: threading.Semaphore,
        held: threading.Event | None = None) -> threading.Thread:
    """`entry` logged inside `block` on a thread of its own, and `moved` released after: after one
    `moved.acquire()` the thread has either blocked in the gate or run. Given `held`, the thread
    releases `moved` once inside too, then holds the block until `held` is set."""
    def body() -> None:
        try:
            with block():
                log.append(entry)
                if held is not None:
                    moved.release()
                    held.wait(HANG)
        finally:
            moved.release()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def gate_signalling(moved: threading.Semaphore) -> CaptureGate:
    gate = CaptureGate()
    gate.changed = Signalling(moved)
    return gate


def test_work_runs_side_by_side_and_a_capture_waits_for_it_and_goes_before_later_work():
    moved, log = threading.Semaphore(0), []
    gate = gate_signalling(moved)
    first, second = gate.work(), gate.work()
    first.__enter__()
    second.__enter__()  # two jobs at once: the second did not wait for the first
    capturing = run(gate.capture, "capture", log, moved)
    assert moved.acquire(timeout=HANG)
    assert log == [] and gate.waiting == 1  # blocked by the running work, not run
    working = run(gate.work, "late work", log, moved)
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


def test_work_arriving_while_a_capture_runs_waits_for_it_and_runs_once_it_ends():
    moved, log, held = threading.Semaphore(0), [], threading.Event()
    gate = gate_signalling(moved)
    capturing = run(gate.capture, "capture", log, moved, held)
    assert moved.acquire(timeout=HANG) and log == ["capture"]  # it runs (nothing else holds the gate), held open
    working = run(gate.work, "work", log, moved)
    assert moved.acquire(timeout=HANG)
    assert log == ["capture"] and gate.working == 0  # blocked by the capture, not run beside it
    held.set()
    capturing.join(timeout=HANG)
    working.join(timeout=HANG)
    assert not capturing.is_alive() and not working.is_alive()  # the capture's end woke the work
    assert log == ["capture", "work"]


def test_a_capture_that_raises_opens_the_gate():
    gate = CaptureGate()
    with pytest.raises(RuntimeError, match="capture failed"), gate.capture():
        raise RuntimeError("capture failed")
    with gate.work():
        assert gate.working == 1 and not gate.capturing
