"""DSI's schedule made independent of the machine's speed, for tests that count what it does.

With `Turns`, target jobs run one at a time, oldest first, and only while the drafter waits for
a result: the drafter always fills its window before a job runs, as with infinitely slow workers,
however loaded the machine is. The tokens, the jobs and the preemptions are then the same on
every run. A worker may also report a fixed duration for its jobs, so that the worker-count
notice, which compares job and draft latencies, does not depend on measured times either.
"""

import threading
from concurrent.futures import Future
from contextlib import contextmanager

import torch

from specchat.dsi.engine import DSIEngine
from specchat.dsi.jobs import VerifyJob
from specchat.dsi.workers import Result, ThreadWorker, WorkerPool, thread_workers

HANG_S = 60.0  # a job that waits this long for its turn fails: a schedule that never gives it ends


class Turns:
    """Which job may run now: the one the drafter's pool named as it began to wait, or any job
    once opened."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.next_job: int | None = None
        self.opened = False

    def give(self, job_id: int) -> None:
        with self.condition:
            self.next_job = job_id
            self.condition.notify_all()

    def open(self) -> None:
        """Every job runs as soon as it can (before the pool closes: it waits for its jobs)."""
        with self.condition:
            self.opened = True
            self.condition.notify_all()

    def wait_turn(self, job_id: int) -> None:
        with self.condition:
            if not self.condition.wait_for(lambda: self.opened or self.next_job == job_id, HANG_S):
                raise TimeoutError(f"job {job_id} waited {HANG_S:.0f} s for its turn")
            if self.next_job == job_id:
                self.next_job = None


class TurnPool(WorkerPool):
    """A WorkerPool that gives the oldest running job its turn whenever the drafter waits."""

    def __init__(self, workers: list, turns: Turns) -> None:
        super().__init__(workers)
        self.turns = turns

    def collect(self, block: bool) -> list[tuple[VerifyJob, Result]]:
        if block and self.running:
            # Nothing runs between turns, so no running job has finished: the oldest runs next.
            self.turns.give(self.running[0].job.id)
        return super().collect(block)


class ScriptedWorker:
    """A thread worker whose jobs wait for their turn (with `turns`) and report `seconds` as their
    duration (when given) instead of the time they took."""

    def __init__(self, inner: ThreadWorker, turns: Turns | None = None, seconds: float | None = None) -> None:
        self.name = inner.name
        self.inner = inner
        self.turns = turns
        self.seconds = seconds

    def start(self, job: VerifyJob) -> Future[Result]:
        return self.inner.executor.submit(self.verify, job)

    def verify(self, job: VerifyJob) -> Result:
        if self.turns is not None:
            self.turns.wait_turn(job.id)
        targets, seconds = self.inner.verifier.verify(job)
        return targets, seconds if self.seconds is None else self.seconds

    def cancel(self, job_id: int) -> None:
        self.inner.cancel(job_id)

    def close(self) -> None:
        self.inner.close()


CPU = torch.device("cpu")


@contextmanager
def dsi(target, draft, workers: int, lookahead: int, stop_ids=()):
    pool = WorkerPool(thread_workers(target, [CPU] * workers))
    try:
        yield DSIEngine(draft, pool, stop_ids, lookahead)
    finally:
        pool.close()
