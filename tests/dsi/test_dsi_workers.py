"""DSI's workers (dsi/workers.py): the pool's queue, dispatch, cancellation and collection with fake
workers resolved by hand; device parsing; target instances sharing weights; thread workers end to end."""

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest
import torch
from helpers.engines import GREEDY, PROMPT
from helpers.gpus import seen_gpu
from helpers.tiny import build_tiny

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.dsi import workers as workers_module
from specchat.dsi.jobs import Preempted, VerifyJob
from specchat.dsi.verifier import TargetVerifier
from specchat.dsi.workers import ThreadWorker, WorkerPool, instance_on, parse_devices, same_device, thread_workers
from specchat.errors import SpecchatError

HANG_S = 30  # bound on a wait that only guards against a hang


class FakeWorker:
    """Starts a job by handing out a Future that the test resolves."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started: list[int] = []
        self.futures: dict[int, Future] = {}
        self.cancelled: list[int] = []
        self.closed = False

    def start(self, job: VerifyJob) -> Future:
        self.started.append(job.id)
        future = self.futures[job.id] = Future()
        return future

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)

    def close(self) -> None:
        self.closed = True


def job(job_id: int) -> VerifyJob:
    return VerifyJob(job_id, (1, 2, 3, job_id), 3, GREEDY)


def result(job_id: int) -> tuple[list[int], float]:
    return [100 + job_id], 0.5


def finish(worker: FakeWorker, job_id: int) -> None:
    worker.futures[job_id].set_result(result(job_id))


def ids(jobs) -> list[int]:
    return [j.id for j in jobs]


@pytest.fixture
def pool_of_two() -> tuple[WorkerPool, FakeWorker, FakeWorker]:
    a, b = FakeWorker("a"), FakeWorker("b")
    return WorkerPool([a, b]), a, b


def test_jobs_go_first_in_first_out_to_idle_workers(pool_of_two):
    pool, a, b = pool_of_two
    for i in range(4):
        pool.submit(job(i))
    assert (a.started, b.started) == ([0], [1])
    assert ids(pool.queue) == [2, 3]  # both busy: the rest wait
    assert ids(pool.live_jobs()) == [0, 1, 2, 3]
    assert pool.collect(block=False) == []  # nothing finished: nothing changes
    assert ids(pool.live_jobs()) == [0, 1, 2, 3]
    finish(b, 1)
    assert pool.collect(block=False) == [(job(1), result(1))]
    assert b.started == [1, 2]  # b was freed and took the oldest queued job
    assert ids(pool.queue) == [3]
    assert ids(pool.live_jobs()) == [0, 2, 3]
    finish(a, 0)
    assert pool.collect(block=False) == [(job(0), result(0))]
    assert a.started == [0, 3] and ids(pool.live_jobs()) == [2, 3]


def test_collect_returns_results_in_the_order_jobs_were_sent(pool_of_two):
    pool, a, b = pool_of_two
    pool.submit(job(0))
    pool.submit(job(1))
    finish(b, 1)
    finish(a, 0)
    assert pool.collect(block=False) == [(job(0), result(0)), (job(1), result(1))]
    assert pool.live_jobs() == [] and len(pool.idle) == 2


def test_cancel_a_queued_job(pool_of_two):
    pool, a, b = pool_of_two
    for i in range(4):
        pool.submit(job(i))
    assert pool.cancel({2}) == 1
    assert ids(pool.queue) == [3] and ids(pool.live_jobs()) == [0, 1, 3]
    assert a.cancelled == b.cancelled == []  # no worker ever saw it
    assert pool.cancel({2}) == 0  # already gone
    assert pool.cancel({99}) == 0
    finish(a, 0)
    pool.collect(block=False)
    assert a.started == [0, 3]  # the cancelled job is never started


@pytest.mark.parametrize("outcome", ["result", "preempted"])
def test_cancel_a_running_job(pool_of_two, outcome):
    pool, a, b = pool_of_two
    for i in range(3):
        pool.submit(job(i))
    assert pool.cancel({0}) == 1
    assert a.cancelled == [0] and b.cancelled == []
    assert ids(pool.live_jobs()) == [1, 2]
    assert pool.cancel({0}) == 0  # counted once, and the worker told once
    assert a.cancelled == [0]
    assert a.started == [0]  # still busy until its job stops
    if outcome == "result":  # it finished before the cancel reached it
        finish(a, 0)
    else:
        a.futures[0].set_exception(Preempted("job 0"))
    assert pool.collect(block=False) == []  # discarded
    assert a.started == [0, 2]  # idle again, it takes the queued job
    assert ids(pool.live_jobs()) == [1, 2]
    finish(a, 2)
    assert pool.collect(block=False) == [(job(2), result(2))]


def test_cancel_counts_queued_and_running_together(pool_of_two):
    pool, _, b = pool_of_two
    for i in range(4):
        pool.submit(job(i))
    assert pool.cancel({1, 3, 42}) == 2
    assert b.cancelled == [1] and ids(pool.live_jobs()) == [0, 2]


@pytest.mark.parametrize("error", [RuntimeError("worker died"), Preempted("job 0")])
def test_error_of_a_job_not_cancelled_is_raised(pool_of_two, error):
    pool, a, _ = pool_of_two
    pool.submit(job(0))
    a.futures[0].set_exception(error)
    with pytest.raises(type(error)) as raised:
        pool.collect(block=False)
    assert raised.value is error


def test_unrelated_error_of_a_cancelled_job_is_raised(pool_of_two):
    pool, a, _ = pool_of_two
    pool.submit(job(0))
    pool.cancel({0})
    a.futures[0].set_exception(ValueError("bad shape"))
    with pytest.raises(ValueError, match="bad shape"):
        pool.collect(block=False)


@pytest.fixture
def pool_waits(monkeypatch) -> threading.Event:
    """Set when a pool begins to wait for its jobs (in concurrent.futures.wait, the pool's only
    way to block): a test acts then, knowing the pool is blocked or about to be."""
    waiting = threading.Event()
    wait = workers_module.wait

    def wait_and_say_so(futures, return_when):
        waiting.set()
        return wait(futures, return_when=return_when)

    monkeypatch.setattr(workers_module, "wait", wait_and_say_so)
    return waiting


def once_waiting(waiting: threading.Event, action: Callable[[], object]) -> threading.Thread:
    """Run `action` on another thread as soon as the pool waits."""
    def act() -> None:
        if waiting.wait(HANG_S):
            action()

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def test_blocking_collect_waits_for_the_first_finished_job(pool_of_two, pool_waits):
    pool, a, b = pool_of_two
    pool.submit(job(0))
    pool.submit(job(1))
    finisher = once_waiting(pool_waits, lambda: finish(b, 1))  # job 1 finishes only once collect waits
    results = pool.collect(block=True)
    assert pool_waits.is_set() and results == [(job(1), result(1))]
    assert not a.futures[0].done() and ids(pool.live_jobs()) == [0]
    finisher.join(HANG_S)
    assert not finisher.is_alive()


def test_blocking_collect_with_nothing_running_returns_without_waiting(pool_waits):
    pool = WorkerPool([FakeWorker("a")])
    assert pool.collect(block=True) == []
    assert not pool_waits.is_set()


def test_blocking_collect_returns_when_a_cancelled_job_stops(pool_of_two, pool_waits):
    """The engine waits on cancelled jobs too: their stop frees a worker for the queue."""
    pool, a, _ = pool_of_two
    for i in range(3):
        pool.submit(job(i))
    pool.cancel({0})
    stopper = once_waiting(pool_waits, lambda: a.futures[0].set_exception(Preempted("job 0")))
    assert pool.collect(block=True) == []
    assert pool_waits.is_set() and a.started == [0, 2]
    stopper.join(HANG_S)
    assert not stopper.is_alive()


def test_close_cancels_live_jobs_and_closes_every_worker(pool_of_two):
    pool, a, b = pool_of_two
    for i in range(4):
        pool.submit(job(i))
    pool.cancel({1})
    pool.close()
    assert a.cancelled == [0] and b.cancelled == [1]  # b's job was cancelled once, before close
    assert list(pool.queue) == [] and pool.live_jobs() == []
    assert a.closed and b.closed


def test_close_of_an_idle_pool_closes_workers():
    workers = [FakeWorker("a"), FakeWorker("b"), FakeWorker("c")]
    WorkerPool(workers).close()
    assert all(w.closed and w.cancelled == [] for w in workers)


class FinishesDuringCollect(Future):
    """A worker's future that completes right after collect first asks whether it is done, as a
    worker thread finishing at that moment would."""

    def __init__(self, value) -> None:
        super().__init__()
        self.value = value
        self.asked = 0

    def done(self) -> bool:
        self.asked += 1
        if self.asked == 1:
            self.set_result(self.value)
            return False
        return super().done()


class RacingWorker(FakeWorker):
    def start(self, job: VerifyJob) -> Future:
        self.started.append(job.id)
        future = self.futures[job.id] = FinishesDuringCollect(result(job.id))
        return future


def test_job_finishing_during_collect_is_not_lost():
    worker = RacingWorker("a")
    pool = WorkerPool([worker])
    pool.submit(job(0))
    pool.submit(job(1))
    collected = pool.collect(block=False) + pool.collect(block=False)
    assert collected[:1] == [(job(0), result(0))]
    assert worker.started[:2] == [0, 1]


def test_error_in_collect_does_not_lose_the_other_finished_workers(pool_of_two):
    pool, a, b = pool_of_two
    for i in range(3):
        pool.submit(job(i))
    a.futures[0].set_exception(RuntimeError("worker died"))
    finish(b, 1)
    with pytest.raises(RuntimeError):
        pool.collect(block=False)
    pool.collect(block=False)
    assert sorted(a.started + b.started) == [0, 1, 2]  # job 2 was given to a freed worker
    assert len(pool.idle) + len(pool.running) == 2


# parse_devices


def test_parse_devices():
    assert parse_devices("cpu,cpu") == [torch.device("cpu"), torch.device("cpu")]
    assert parse_devices(" cpu , cpu:0 ") == [torch.device("cpu"), torch.device("cpu:0")]
    assert parse_devices("cpu") == [torch.device("cpu")]


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("", "--workers must be a comma list of devices such as cpu,cpu (got '')"),
        ("cpu,,cpu", "(got 'cpu,,cpu')"),
        ("cpu,", "(got 'cpu,')"),
        ("tpu", "--workers: 'tpu' is not a device (use cpu, cuda or cuda:N)"),
        ("gpu0", "'gpu0' is not a device"),
        ("cpu,gpu0", "'gpu0' is not a device"),
        ("meta", "'meta' is not a cpu or cuda device"),
        ("cuda:0", "--workers: cuda:0 is not available on this machine"),
        ("cpu,cuda", "cuda is not available on this machine"),
    ],
)
def test_parse_devices_errors(monkeypatch, spec, fragment):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecchatError) as raised:
        parse_devices(spec)
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def test_parse_devices_cuda_checks_the_index(monkeypatch):
    seen_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_devices("cuda:0,cuda:1,cuda") == [torch.device("cuda:0"), torch.device("cuda:1"), torch.device("cuda")]
    with pytest.raises(SpecchatError, match="cuda:2 is not available"):
        parse_devices("cuda:0,cuda:2")


# instance_on


@pytest.mark.parametrize("a, b, same", [("cpu", "cpu", True), ("cuda", "cuda:0", True), ("cuda:0", "cuda:1", False),
                                        ("cuda:1", "cuda:1", True), ("cpu", "cuda:0", False),
                                        ("cuda", "cuda:1", False)])
def test_same_device_takes_an_unnumbered_cuda_as_the_first(a, b, same):
    assert same_device(torch.device(a), torch.device(b)) == same == same_device(torch.device(b), torch.device(a))


def test_instance_on_the_same_device_shares_weights_not_modules(tiny_target):
    model = tiny_target.model
    copy = instance_on(model, torch.device("cpu"))
    assert copy is not model and type(copy) is type(model)
    assert copy.get_decoder().layers[0] is not model.get_decoder().layers[0]
    pairs = list(zip(copy.state_dict().values(), model.state_dict().values(), strict=True))
    assert all(mine.data_ptr() == theirs.data_ptr() for mine, theirs in pairs)
    assert all(mine is theirs for mine, theirs in zip(copy.parameters(), model.parameters(), strict=True))
    # hooks are per module: one on the copy is not on the original
    before = len(model.get_decoder().layers[1]._forward_pre_hooks)
    calls = []
    handle = copy.get_decoder().layers[1].register_forward_pre_hook(lambda _m, _a: calls.append(1))
    try:
        assert len(model.get_decoder().layers[1]._forward_pre_hooks) == before
        tokens = torch.tensor([PROMPT])
        with torch.no_grad():
            assert torch.equal(copy(tokens).logits, model(tokens).logits)
        assert calls == [1]  # only the copy's forward ran it
    finally:
        handle.remove()


def test_instance_on_another_device_copies_the_weights(tiny_target):
    model = tiny_target.model
    copy = instance_on(model, torch.device("meta"))
    assert copy.device.type == "meta" and model.device.type == "cpu"
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert not any(mine is theirs for mine, theirs in zip(copy.parameters(), model.parameters()))


# thread workers over the tiny target


def sequential(model, new_tokens: int = 12) -> list[int]:
    events = AutoregressiveEngine(model, stop_ids=[]).generate(PROMPT, new_tokens, GREEDY)
    return [t for e in events for t in e.token_ids]


def test_thread_workers_share_the_target_and_verify_exactly(tiny_target):
    layers = tiny_target.model.get_decoder().layers
    hooks_before = [len(layer._forward_pre_hooks) for layer in layers]
    workers = thread_workers(tiny_target, parse_devices("cpu,cpu"))
    assert [w.name for w in workers] == ["cpu#0", "cpu#1"]
    assert all(isinstance(w, ThreadWorker) for w in workers)
    first = next(workers[0].verifier.target.model.parameters())
    assert first.data_ptr() == next(tiny_target.model.parameters()).data_ptr()
    assert workers[0].verifier.target.model is not workers[1].verifier.target.model
    assert [len(layer._forward_pre_hooks) for layer in layers] == hooks_before  # the original is untouched

    ref = sequential(tiny_target)
    wrong = (ref[5] + 1) % 50
    jobs = [
        VerifyJob(0, tuple(PROMPT), len(PROMPT), GREEDY),
        VerifyJob(1, tuple(PROMPT + ref[:4]), len(PROMPT), GREEDY),
        VerifyJob(2, tuple(PROMPT + ref[:5] + [wrong, ref[6]]), len(PROMPT) + 2, GREEDY),
        VerifyJob(3, tuple(PROMPT + ref[:8]), len(PROMPT) + 6, GREEDY),
    ]
    reference = TargetVerifier(build_tiny(0))
    expected = {j.id: reference.verify(j)[0] for j in jobs}
    assert expected[1] == ref[:5] and expected[3] == ref[6:9]

    pool = WorkerPool(workers)
    try:
        for j in jobs:
            pool.submit(j)
        got = {}
        deadline = time.perf_counter() + HANG_S
        while len(got) < len(jobs) and time.perf_counter() < deadline:
            for done, (targets, seconds) in pool.collect(block=True):
                assert seconds > 0
                got[done.id] = targets
        assert got == expected
    finally:
        pool.close()
    assert all(w.executor._shutdown for w in workers)


def test_thread_worker_cancel_from_another_thread_preempts_mid_forward(tiny_target):
    worker = thread_workers(tiny_target, [torch.device("cpu")])[0]
    pool = WorkerPool([worker])
    ref = sequential(tiny_target)
    slow = VerifyJob(0, tuple(PROMPT + ref[:3]), len(PROMPT), GREEDY)
    entered, go = threading.Event(), threading.Event()

    def pause(_module, _args):  # after the verifier's own check on layer 0
        if worker.verifier.running == slow.id:
            entered.set()
            go.wait(HANG_S)

    handle = worker.verifier.target.model.get_decoder().layers[0].register_forward_pre_hook(pause)
    try:
        pool.submit(slow)
        slow_future = pool.running[0].future
        follow = VerifyJob(1, tuple(PROMPT + ref[:2]), len(PROMPT) + 1, GREEDY)
        pool.submit(follow)
        assert entered.wait(HANG_S)
        assert pool.cancel({0}) == 1  # from this thread, while the worker is inside layer 0
        go.set()
        assert pool.collect(block=True) == []  # job 0 stopped, and its stop was discarded
        assert isinstance(slow_future.exception(), Preempted)
        assert ids(pool.live_jobs()) == [1]  # the freed worker took the queued job
        results = pool.collect(block=True)
        assert [(done.id, targets) for done, (targets, _) in results] == [(1, ref[1:3])]
    finally:
        handle.remove()
        go.set()
        pool.close()
    for layer in worker.verifier.history.caches[0].layers:
        assert layer.keys.shape[-2] == len(follow.tokens)


def test_closing_a_thread_worker_waits_for_the_job_it_runs(tiny_target):
    """Close returns once the running verification is over: nothing is left reading the target."""
    worker = thread_workers(tiny_target, [torch.device("cpu")])[0]
    entered, go = threading.Event(), threading.Event()

    def pause(_module, _args):
        entered.set()
        go.wait(HANG_S)

    handle = worker.verifier.target.model.get_decoder().layers[0].register_forward_pre_hook(pause)
    try:
        future = worker.start(VerifyJob(0, tuple(PROMPT), len(PROMPT), GREEDY))
        assert entered.wait(HANG_S)
        threading.Timer(0.2, go.set).start()  # the job goes on a moment after close is called
        worker.close()
        assert future.done()
    finally:
        handle.remove()
        go.set()
