"""The scheduler on its own, without HTTP: jobs run one at a time in the order they arrived, each
timed from its arrival to its end; a waiting job can be withdrawn or outrun by a request (when it
only warms a slot); a conversation goes back to the slot holding it; a failure reaches its job and
the log, and the next job runs; shutdown answers every waiting job and ends the thread.

Nothing here waits on a clock: the tests follow the decoding thread through the fake engine's gate,
the jobs' own events, and an observer told of each start; a hang is pytest-timeout's to end."""

import asyncio
import logging
import threading

import pytest
from helpers.serve_helpers import loop  # noqa: F401 (a fixture)

from specchat.decoding.events import SamplingParams
from specchat.serve.errors import APIError
from specchat.serve.scheduler import Job, QueueFull, Scheduler, common_prefix
from specchat.tui.fake import WORKER_NOTICE, FakeDSIEngine, FakeEngine, FakeTokenizer, Gate

REPLY = "four"  # one token an iteration: four iterations, each let through by the test's gate


@pytest.fixture
def gated(loop):
    """A started scheduler over one engine that runs an iteration only when the test allows it
    (closed before the jobs' event loop is)."""
    gate = Gate()
    engine = FakeEngine(reply=REPLY, accepted=(0,), gate=gate)
    scheduler = Scheduler([engine], max_queue=4)
    scheduler.observers.append(Starts())
    scheduler.start()
    yield scheduler, engine, gate
    gate.open()
    scheduler.close()


def job(loop, prompt_ids=(1,), **fields) -> Job:
    return Job(list(prompt_ids), 100, SamplingParams(), loop, **fields)


def tokens_of(loop, job: Job) -> list[int]:
    """The tokens `job`'s events bring, once it has ended."""
    async def collect() -> list[int]:
        return [token async for event in job.events() for token in event.token_ids]
    return loop.run_until_complete(collect())


class Starts:
    """A JobObserver that lets a test wait until a job has started (it then is `running`, and the
    jobs after it wait)."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.started: list[Job] = []

    def on_start(self, job: Job) -> None:
        with self.condition:
            self.started.append(job)
            self.condition.notify_all()

    def on_event(self, job: Job, event) -> None:
        pass

    def on_end(self, job: Job) -> None:
        pass

    def wait(self, job: Job) -> None:
        with self.condition:
            self.condition.wait_for(lambda: any(each is job for each in self.started))


def wait_started(scheduler: Scheduler, job: Job) -> None:
    """Return once `job` runs on `gated`'s scheduler (its first observer is a Starts)."""
    scheduler.observers[0].wait(job)


def running_and_waiting(scheduler: Scheduler, loop) -> tuple[Job, Job]:
    """Two jobs submitted, once the first runs (held at the gate) and the second waits."""
    running = submitted(scheduler, job(loop, [1]))
    waiting = submitted(scheduler, job(loop, [2]))
    wait_started(scheduler, running)
    return running, waiting


def test_jobs_run_whole_one_at_a_time_in_the_order_they_arrived(gated, loop):
    scheduler, engine, gate = gated
    jobs = [job(loop, [number]) for number in (1, 2, 3)]
    for each in jobs:
        scheduler.submit(each)
    wait_started(scheduler, jobs[0])
    assert list(scheduler.waiting) == jobs[1:]  # a request is not a warm-up: none gives way
    gate.open()
    assert [tokens_of(loop, each) for each in jobs] == [FakeTokenizer().encode(REPLY)] * 3
    assert [call[0] for call in engine.calls] == [[1], [2], [3]]
    assert [(each.arrived, each.started) for each in jobs] == [(1, 1), (2, 2), (3, 3)]


def test_a_job_is_timed_from_its_arrival_through_its_first_token_to_its_end(gated, loop):
    scheduler, _, gate = gated
    first, second = running_and_waiting(scheduler, loop)
    # Not yet started: no order, no wait measured, no token and no end.
    assert (second.started, second.queue_s, second.first_token_s, second.ended_s) == (0, 0.0, 0.0, 0.0)
    assert first.ended_s == 0.0 and first.first_token_s == 0.0  # held before its first iteration
    gate.open()
    tokens_of(loop, first)
    tokens_of(loop, second)
    for each in (first, second):
        assert 0 < each.enqueued_s <= each.started_s <= each.first_token_s <= each.ended_s
        assert each.queue_s == each.started_s - each.enqueued_s
    assert second.queue_s >= first.ended_s - second.enqueued_s  # it waited for the whole first job


def test_the_queue_refuses_past_its_bound_and_a_request_displaces_the_warm_ups_waiting(gated, loop):
    scheduler, engine, gate = gated
    running = job(loop, [0])
    scheduler.submit(running)
    wait_started(scheduler, running)
    warm = submitted(scheduler, job(loop, [1], warm=True))
    queued = [submitted(scheduler, job(loop, [number])) for number in (2, 3, 4, 5)]
    with pytest.raises(QueueFull, match=r"^the queue is full \(4 requests waiting\): retry later$"):
        scheduler.submit(job(loop, [6]))
    assert warm.cancel.is_set() and tokens_of(loop, warm) == []  # given way, released
    gate.open()
    for each in [running, *queued]:
        tokens_of(loop, each)
    assert [call[0] for call in engine.calls] == [[0], [2], [3], [4], [5]]


def test_withdrawing_the_running_job_stops_it_at_its_next_iteration(gated, loop):
    scheduler, _, gate = gated
    running = job(loop)
    scheduler.submit(running)
    gate.allow(1)
    first = loop.run_until_complete(running.inbox.get())  # the next iteration is held at the gate
    scheduler.withdraw(running)
    gate.open()
    # the iteration in progress ends, and its event is the last run_reply reads: nothing more comes
    assert len(first.token_ids) == 1 and tokens_of(loop, running) == []


def test_a_withdrawn_waiting_job_never_runs_and_is_released(gated, loop):
    scheduler, engine, gate = gated
    running, waiting = running_and_waiting(scheduler, loop)
    scheduler.withdraw(waiting)
    assert not scheduler.waiting and tokens_of(loop, waiting) == []
    gate.open()
    tokens_of(loop, running)
    assert [call[0] for call in engine.calls] == [[1]]


def test_a_failure_reaches_its_job_and_the_servers_log_and_the_next_job_runs(loop, caplog):
    caplog.set_level(logging.ERROR, logger="specchat.serve")
    broken = FakeEngine(reply=REPLY)
    broken.generate = failing_generate
    scheduler = Scheduler([broken], max_queue=4)
    failed = job(loop)
    scheduler.submit(failed)
    scheduler.start()
    try:
        with pytest.raises(RuntimeError, match="the engine broke"):
            tokens_of(loop, failed)
        records = [(record.name, record.getMessage()) for record in caplog.records]
        assert records == [("specchat.serve", "decoding failed")]
        assert caplog.records[0].exc_info is not None  # the traceback is in the server's log
        del broken.generate  # the engine mends: the thread is still there to run the next job
        assert tokens_of(loop, submitted(scheduler, job(loop))) == FakeTokenizer().encode(REPLY)
    finally:
        scheduler.close()


def failing_generate(prompt_ids, max_new_tokens, sampling):
    raise RuntimeError("the engine broke")
    yield


def submitted(scheduler: Scheduler, new: Job) -> Job:
    scheduler.submit(new)
    return new


def test_shutdown_answers_each_waiting_job_503_and_empties_the_queue(gated, loop):
    scheduler, _, _ = gated
    running, waiting = running_and_waiting(scheduler, loop)
    scheduler.stop_all()
    assert not scheduler.waiting and running.cancel.is_set() and waiting.cancel.is_set()
    with pytest.raises(APIError) as refused:
        tokens_of(loop, waiting)
    assert refused.value.body() == {"error": {"message": "the server is shutting down", "type": "server_error",
                                              "param": None, "code": "shutting_down"}}
    assert refused.value.status == 503
    assert loop.run_until_complete(waiting.inbox.get()) is None  # and then its end: nothing more comes


def test_close_waits_for_the_iteration_in_progress_and_ends_the_decoding_thread(gated, loop):
    scheduler, _, gate = gated
    running = job(loop)
    scheduler.submit(running)
    wait_started(scheduler, running)
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    running.cancel.wait()  # close has begun: it cancels the running job first
    assert closer.is_alive()  # the iteration in progress is held at the gate
    gate.open()
    closer.join()
    assert not closer.is_alive() and not scheduler.thread.is_alive()


def test_the_decoding_thread_never_holds_the_process_and_is_named_in_thread_dumps():
    thread = Scheduler([FakeEngine()], max_queue=1).thread
    assert thread.daemon and thread.name == "specchat-decoding"


def test_a_scheduler_never_started_closes():
    scheduler = Scheduler([FakeEngine()], max_queue=1)
    scheduler.close()
    assert scheduler.closed and not scheduler.thread.is_alive()


@pytest.mark.parametrize("first, second, size", [([], [1], 0), ([1, 2, 3], [1, 2, 4], 2), ([1, 2], [1, 2, 3], 2),
                                                  ([5], [6], 0), ([1, 2, 3], [1, 2, 3], 3)])
def test_the_common_prefix_counts_the_leading_tokens_both_share(first, second, size):
    assert common_prefix(first, second) == size


def test_a_conversation_returns_to_its_slot_and_a_new_one_takes_the_least_recently_used():
    loop = asyncio.new_event_loop()
    engines = [FakeEngine(reply="ab", name=name) for name in ("first", "second")]
    scheduler = Scheduler(engines, max_queue=4)
    scheduler.start()
    try:
        one = run_one(scheduler, loop, [1, 2])  # the first slot then holds [1, 2, 97, 98]
        other = run_one(scheduler, loop, [9, 9])  # a new conversation: the slot never used
        # Sharing half of a slot's sequence (its prompt and reply, [9, 9, 97, 98]) is not enough to
        # continue it: the least recently used slot takes this one.
        half = run_one(scheduler, loop, [9, 9, 5])
        again = run_one(scheduler, loop, [9, 9, 97, 98, 6])  # continues the second slot's
        assert [each.engine for each in (one, other, half, again)] == ["first", "second", "first", "second"]
        assert engines[1].calls[1][0] == [9, 9, 97, 98, 6]
    finally:
        scheduler.close()
        loop.close()


def run_one(scheduler: Scheduler, loop, prompt_ids: list[int]) -> Job:
    ran = submitted(scheduler, job(loop, prompt_ids))
    tokens_of(loop, ran)
    return ran


def test_an_engines_notice_goes_to_the_servers_log(loop, caplog):
    caplog.set_level(logging.INFO, logger="specchat.serve")
    scheduler = Scheduler([FakeDSIEngine(reply=REPLY)], max_queue=1)
    scheduler.start()
    try:
        run_one(scheduler, loop, [1])
    finally:
        scheduler.close()
    assert [(record.name, record.getMessage()) for record in caplog.records] == [
        ("specchat.serve", f"notice: {WORKER_NOTICE}")]


def test_work_runs_on_the_first_slot_unless_it_keeps_its_prompt_there_for_the_reply_that_follows(loop):
    engines = [FakeEngine(reply="ab", name=name) for name in ("first", "second")]
    scheduler = Scheduler(engines, max_queue=4)
    scheduler.start()
    try:
        run_one(scheduler, loop, [1, 2])  # the first slot then holds [1, 2, 97, 98]; the second is free
        scored = worked(scheduler, loop, [5, 6, 7], keeps=False)
        assert loop.run_until_complete(scored.result()) == ("first", [5, 6, 7]) and scored.engine == "first"
        kept = worked(scheduler, loop, [5, 6, 7], keeps=True)  # a new conversation: the slot never used
        assert loop.run_until_complete(kept.result()) == ("second", [5, 6, 7]) and kept.engine == "second"
        # the reply to the kept prompt comes to the slot holding it; the first still holds its own
        assert [run_one(scheduler, loop, prompt).engine for prompt in ([5, 6, 7, 8], [1, 2, 97, 98, 3])] == [
            "second", "first"]
    finally:
        scheduler.close()


def worked(scheduler: Scheduler, loop, prompt_ids: list[int], keeps: bool) -> Job:
    """A submitted job whose work returns the engine it ran on and the prompt it was given."""
    return submitted(scheduler, job(loop, prompt_ids, keeps=keeps,
                                    work=lambda engine, cancel: (engine.name, list(prompt_ids))))
