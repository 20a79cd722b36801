"""One decoding thread over the server's engines: requests wait in a bounded FIFO queue, each runs
to its end (or its cancel) before the next starts, and its events cross to the event loop.

Each engine (a *slot*) keeps the caches of the last sequence it produced; a request that
continues a slot's conversation goes back to that slot, with its whole token sequence, so the
engine can reuse the common prefix instead of computing the history again.
"""

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import count
from time import perf_counter
from typing import Protocol

from specchat.decoding.events import Engine, IterationEvent, SamplingParams
from specchat.errors import SpecchatError
from specchat.reply_loop import run_reply
from specchat.serve.errors import APIError

logger = logging.getLogger("specchat.serve")

END = None  # after a job's last event (or its failure)


class QueueFull(Exception):
    """Every place in the queue is taken."""


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", "shutting_down", kind="server_error")


@dataclass(eq=False)
class Job:
    """One request's reply: what to decode, and the inbox its events arrive in, on `loop`."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    arrived: int = 0  # the scheduler's count of accepted requests, at this one
    started: int = 0  # the scheduler's count of started requests, at this one (0: not started)
    enqueued_s: float = 0.0
    started_s: float = 0.0
    first_token_s: float = 0.0  # when its first token was decoded (0: none yet)
    ended_s: float = 0.0
    engine: str = ""
    warm: bool = False  # only computes its prompt into a slot: it gives way to any request after it
    # Instead of decoding: a computation on an engine, given the job's cancel (an embedding,
    # serve/embeddings.py), its result the job's one item (`result`)
    work: Callable[[Engine, threading.Event], object] | None = None
    keeps: bool = False  # the work leaves the engine's caches holding prompt_ids (a prompt's scoring)

    def deliver(self, item: object) -> None:
        """From the decoding thread: hand `item` to the request's coroutine."""
        self.loop.call_soon_threadsafe(self.inbox.put_nowait, item)

    async def events(self) -> AsyncIterator[IterationEvent]:
        """The job's events as they arrive; a decoding failure is raised here."""
        while (item := await self.inbox.get()) is not END:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def result(self) -> object:
        """What the job's `work` returned, once it has run; its failure is raised here."""
        item = await self.inbox.get()
        if isinstance(item, BaseException):
            raise item
        return item

    @property
    def queue_s(self) -> float:
        return self.started_s - self.enqueued_s if self.started else 0.0


class JobObserver(Protocol):
    """Told, on the decoding thread, of each job's start, events and end (serve/metrics.py)."""

    def on_start(self, job: Job) -> None: ...

    def on_event(self, job: Job, event: IterationEvent) -> None: ...

    def on_end(self, job: Job) -> None: ...


@dataclass(eq=False)
class Slot:
    engine: Engine
    sequence: list[int] = field(default_factory=list)  # the last prompt and the tokens produced after it
    last_used: int = 0


def common_prefix(first: list[int], second: list[int]) -> int:
    size = 0
    for a, b in zip(first, second):
        if a != b:
            break
        size += 1
    return size


class Scheduler:
    def __init__(self, engines: list[Engine], max_queue: int) -> None:
        self.slots = [Slot(engine) for engine in engines]
        self.max_queue = max_queue  # requests waiting, beyond the one decoding
        self.waiting: deque[Job] = deque()
        self.running: Job | None = None
        self.condition = threading.Condition()
        self.closed = False
        self.arrivals, self.starts, self.uses = count(1), count(1), count(1)
        self.observers: list[JobObserver] = []
        self.thread = threading.Thread(target=self.work, name="specchat-decoding", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop_all(self) -> None:
        """At shutdown: waiting requests are answered 503, the running one stops at its next
        iteration, and nothing new is accepted."""
        with self.condition:
            self.closed = True
            for job in self.waiting:
                job.cancel.set()
                job.deliver(shutting_down())
                job.deliver(END)
            self.waiting.clear()
            if self.running is not None:
                self.running.cancel.set()
            self.condition.notify()

    def close(self) -> None:
        """Stop everything, and the thread once its iteration in progress ends."""
        self.stop_all()
        if self.thread.is_alive():
            self.thread.join()

    def submit(self, job: Job) -> None:
        """Queue `job` last, in place of the warm-ups still waiting; QueueFull past the bound."""
        with self.condition:
            if self.closed:
                raise shutting_down()
            for waiting in [waiting for waiting in self.waiting if waiting.warm]:
                self.drop(waiting)
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting): retry later")
            job.arrived, job.enqueued_s = next(self.arrivals), perf_counter()
            self.waiting.append(job)
            self.condition.notify()

    def withdraw(self, job: Job) -> None:
        """The client is gone or has what it wanted: free its place in the queue, or stop its
        decode at the next iteration."""
        job.cancel.set()
        with self.condition:
            if job in self.waiting:
                self.drop(job)

    def drop(self, job: Job) -> None:
        """Take waiting `job` out of the queue (under the condition's lock): it will never run, and
        whoever awaits its events is released."""
        job.cancel.set()
        self.waiting.remove(job)
        job.deliver(END)

    def work(self) -> None:
        while (job := self.next_job()) is not None:
            try:
                self.run(job)
            finally:
                with self.condition:
                    self.running = None

    def next_job(self) -> Job | None:
        with self.condition:
            while not self.waiting and not self.closed:
                self.condition.wait()
            if self.closed:
                return None
            self.running = self.waiting.popleft()
            self.running.started, self.running.started_s = next(self.starts), perf_counter()
            return self.running

    def run(self, job: Job) -> None:
        """Decode `job`'s reply on the slot it continues, or run its `work`: on that slot too where the
        work keeps its prompt in the engine's caches, else on the first slot's engine, whose kept
        caches it leaves as they were."""
        slot = self.slots[0] if job.work is not None and not job.keeps else self.pick(job.prompt_ids)
        job.engine = slot.engine.name
        for observer in self.observers:
            observer.on_start(job)
        try:
            if job.work is not None:
                job.deliver(self.computed(job, slot))
            else:
                self.decode(job, slot)
        except SpecchatError as error:
            job.deliver(error)
        except Exception as error:  # an engine's failure: this request gets a 500, the server goes on
            logger.exception("decoding failed")
            job.deliver(error)
        finally:
            job.ended_s = perf_counter()
            for observer in self.observers:
                observer.on_end(job)
            job.deliver(END)

    def computed(self, job: Job, slot: Slot) -> object:
        """What `job`'s work returns; where it keeps its prompt, the slot then holds that prompt, so
        that the reply to it comes to this slot."""
        if not job.keeps:
            return job.work(slot.engine, job.cancel)
        slot.sequence = []  # until the engine's caches are known again
        try:
            result = job.work(slot.engine, job.cancel)
            slot.sequence = list(job.prompt_ids)
            return result
        finally:
            slot.last_used = next(self.uses)

    def decode(self, job: Job, slot: Slot) -> None:
        produced: list[int] = []

        def on_event(event: IterationEvent) -> None:
            if event.token_ids and not job.first_token_s:
                job.first_token_s = perf_counter()
            produced.extend(event.token_ids)
            for observer in self.observers:
                observer.on_event(job, event)
            job.deliver(event)

        slot.sequence = []  # until the engine's caches are known again
        try:
            run_reply(slot.engine, job.prompt_ids, job.max_new_tokens, job.sampling, job.cancel, on_event,
                      on_notice=lambda notice: logger.info("notice: %s", notice))
            slot.sequence = job.prompt_ids + produced
        finally:
            slot.last_used = next(self.uses)

    def pick(self, prompt_ids: list[int]) -> Slot:
        """The slot whose conversation `prompt_ids` continues (it shares more than half of that
        slot's sequence), else the least recently used one: a new conversation never evicts a
        conversation for the sake of a shared system prompt."""
        best = max(self.slots, key=lambda slot: common_prefix(slot.sequence, prompt_ids))
        if best.sequence and 2 * common_prefix(best.sequence, prompt_ids) > len(best.sequence):
            return best
        return min(self.slots, key=lambda slot: slot.last_used)
