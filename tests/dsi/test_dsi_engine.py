"""The DSI engine on tiny models: exactness against autoregressive decoding (greedy and seeded)
for several worker counts and lookaheads, preemption, limits, the worker-count notice, cache
reuse across replies, and cancellation when the consumer stops early.

Exactness runs on the natural schedule, whatever the machine's speed makes of it; what depends
on the schedule (preemptions, jobs in flight, the notice) runs on tests/helpers/dsi_turns.py's fixed one.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
from helpers.dsi_turns import CPU, ScriptedWorker, TurnPool, Turns, dsi
from helpers.engines import GREEDY, PROMPT, fresh_logits, run
from helpers.exactness import NEAR_TIE

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.kvcache import new_cache
from specchat.decoding.sampling import sample_token
from specchat.decoding.token_log import TokenLog
from specchat.dsi.engine import MIN_SAMPLES, RECENT, DSIEngine, Latencies, Reply, Tally
from specchat.dsi.jobs import VerifyJob
from specchat.dsi.workers import WorkerPool, thread_workers
from specchat.errors import SpecchatError

SEEDED = SamplingParams(0.6, 0.9, seed=11)


@contextmanager
def dsi_in_turns(target, draft, workers: int, lookahead: int) -> Iterator[DSIEngine]:
    """DSI whose target jobs run one at a time, oldest first, only while the drafter waits: the
    drafter always runs as far ahead as its window lets it, on any machine."""
    turns = Turns()
    pool = TurnPool([ScriptedWorker(worker, turns) for worker in thread_workers(target, [CPU] * workers)], turns)
    try:
        yield DSIEngine(draft, pool, (), lookahead)
    finally:
        turns.open()  # closing the pool waits for the jobs still waiting for a turn
        pool.close()


@contextmanager
def dsi_reporting(target, draft, workers: int, lookahead: int, job_s: float) -> Iterator[DSIEngine]:
    """DSI whose workers report every job as taking `job_s`."""
    pool = WorkerPool([ScriptedWorker(worker, seconds=job_s) for worker in thread_workers(target, [CPU] * workers)])
    try:
        yield DSIEngine(draft, pool, (), lookahead)
    finally:
        pool.close()


@contextmanager
def slowed(model, seconds: float):
    """Every forward of `model` takes at least `seconds` longer (a hook on its first layer): a
    lower bound on its latency that no machine can beat."""
    def sleep(_module, _args):
        time.sleep(seconds)
    handle = model.get_decoder().layers[0].register_forward_pre_hook(sleep)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("workers,lookahead", [(1, 1), (1, 4), (2, 1), (2, 3), (3, 2)])
def test_dsi_equals_autoregressive(tiny_target, tiny_draft, rough_draft, sampling, workers, lookahead):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling, 60)
    for draft in (tiny_draft, rough_draft):
        with dsi(tiny_target, draft, workers, lookahead) as engine:
            tokens, events = run(engine, sampling, 60)
        assert tokens == reference
        assert events[-1].finished and not any(e.finished for e in events[:-1])
        assert all(e.accepted == len(e.token_ids) - 1 <= e.tree_size for e in events)


def test_dsi_under_llama_cpps_cuts_equals_autoregressive(tiny_target, tiny_draft):
    """XTC's coin keyed by (seed, position): jobs verifying apart decide it as sequential decoding
    does; and so the dynamic temperature, a function of each position's logits."""
    sampling = SamplingParams(1.0, 1.0, seed=7, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.05,
                              dynatemp_range=0.5)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling, 60)
    assert reference != run(AutoregressiveEngine(tiny_target, []), replace(sampling, xtc_probability=0.0), 60)[0]
    assert reference != run(AutoregressiveEngine(tiny_target, []), replace(sampling, dynatemp_range=0.0), 60)[0]
    with dsi(tiny_target, tiny_draft, 2, 3) as engine:
        assert run(engine, sampling, 60)[0] == reference


def test_a_good_draft_is_accepted(tiny_target):
    """The target as its own draft: no draft is ever rejected, so nothing is preempted."""
    with dsi(tiny_target, tiny_target, workers=2, lookahead=4) as engine:
        tokens, events = run(engine, GREEDY, 60)
    assert tokens == run(AutoregressiveEngine(tiny_target, []), GREEDY, 60)[0]
    assert sum(e.accepted for e in events) > 0
    assert sum(e.jobs_preempted for e in events) == 0


def test_rejections_preempt_jobs_in_flight(tiny_target, rough_draft):
    """Workers that run only once the drafter has filled its window, and an often wrong drafter:
    several jobs are in flight when a draft is rejected, and the jobs built on it are cancelled,
    with the output still exact."""
    reference, _ = run(AutoregressiveEngine(tiny_target, []), GREEDY, 40)
    with dsi_in_turns(tiny_target, rough_draft, workers=2, lookahead=1) as engine:
        tokens, events = run(engine, GREEDY, 40)
    assert tokens == reference
    assert sum(e.jobs_preempted for e in events) > 0
    assert sum(e.jobs_submitted for e in events) > len(events)


def test_stops_at_a_stop_token_and_at_the_limit(tiny_target, tiny_draft):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), GREEDY, 40)
    stop = reference[10]
    first = reference.index(stop)
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=3, stop_ids=[stop]) as engine:
        tokens, events = run(engine, GREEDY, 40)
        assert tokens == reference[: first + 1] and events[-1].finished
        for limit in (1, 2, 7):
            engine.stop_ids = frozenset()
            tokens, events = run(engine, GREEDY, limit)
            assert tokens == reference[:limit] and events[-1].finished


def test_replies_reuse_the_workers_and_stay_exact(tiny_target, tiny_draft):
    other_prompt = [4, 4, 8, 1]
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=2) as engine:
        for prompt in (PROMPT, PROMPT, other_prompt, PROMPT):
            for sampling in (GREEDY, SEEDED):
                reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling, 30, prompt)
                assert run(engine, sampling, 30, prompt)[0] == reference


def test_stopping_early_cancels_every_job(tiny_target):
    """The target as its own draft: no draft is rejected, so the jobs sent for the drafts beyond
    the first event are all in flight when the consumer stops."""
    with dsi_in_turns(tiny_target, tiny_target, workers=2, lookahead=1) as engine:
        reply = engine.generate(PROMPT, 40, GREEDY)
        next(reply)
        assert len(engine.pool.live_jobs()) > 1
        reply.close()
        assert engine.pool.live_jobs() == []
        reference, _ = run(AutoregressiveEngine(tiny_target, []), GREEDY, 20)
        assert run(engine, GREEDY, 20)[0] == reference


def test_lookahead_changes_apply_mid_reply(tiny_target):
    """The drafter runs ahead of the worker, so jobs carry as many drafts as the lookahead."""
    with dsi_in_turns(tiny_target, tiny_target, workers=1, lookahead=2) as engine:
        reply = engine.generate(PROMPT, 60, GREEDY)
        first = next(reply)
        engine.apply(LiveSettings(lookahead=6))
        rest = list(reply)
    assert first.tree_size <= 2
    assert max(e.tree_size for e in rest) > 2


def test_too_few_workers_get_one_notice(tiny_target, tiny_draft):
    """A target job far slower than k drafts (a minute, against a tiny model's token): the paper's
    bound asks for more than one worker."""
    with dsi_reporting(tiny_target, tiny_draft, workers=1, lookahead=1, job_s=60.0) as engine:
        notices = [e.notice for e in run(engine, GREEDY, 30)[1] + run(engine, GREEDY, 30)[1] if e.notice]
    assert len(notices) == 1
    assert notices[0].startswith("dsi: 1 worker, fewer than the ")


def test_enough_workers_get_no_notice(tiny_target, tiny_draft):
    """A drafter far slower than a target job (at least 20 ms a token, against 1 ms a job): one
    worker keeps up."""
    with dsi_reporting(tiny_target, tiny_draft, workers=2, lookahead=5, job_s=0.001) as engine:
        with slowed(tiny_draft.model, 0.02):
            events = run(engine, GREEDY, 30)[1]
    assert not any(e.notice for e in events)


def sent_jobs(engine: DSIEngine, monkeypatch) -> list[VerifyJob]:
    """Every job the engine sends from now on, in order."""
    jobs = []
    submit = engine.pool.submit

    def record(job: VerifyJob) -> None:
        jobs.append(job)
        submit(job)

    monkeypatch.setattr(engine.pool, "submit", record)
    return jobs


def drafted_positions(engine: DSIEngine, monkeypatch) -> list[int]:
    """The position of every draft the engine makes from now on."""
    positions = []
    draft_one = engine.draft_one

    def record(reply: Reply, *args) -> None:
        draft_one(reply, *args)
        positions.append(len(reply.spec) - 1)

    monkeypatch.setattr(engine, "draft_one", record)
    return positions


@pytest.mark.parametrize("workers,lookahead", [(1, 2), (2, 1)])
def test_the_drafter_fills_its_window_and_drafts_nothing_that_decides_nothing(tiny_target, monkeypatch, workers,
                                                                              lookahead):
    """Workers that run only while the drafter waits, and the target as its own draft: a job
    carries up to lookahead x (workers + 1) drafts, the window, and some carry that many; no draft
    sits at the reply's last position (limit - 1: the job before it decides that position)."""
    new_tokens = 12
    with dsi_in_turns(tiny_target, tiny_target, workers, lookahead) as engine:
        jobs = sent_jobs(engine, monkeypatch)
        drafted = drafted_positions(engine, monkeypatch)
        tokens, _ = run(engine, GREEDY, new_tokens)
    assert tokens == run(AutoregressiveEngine(tiny_target, []), GREEDY, new_tokens)[0]
    assert max(job.drafts for job in jobs) == lookahead * (workers + 1)
    assert max(drafted) == len(PROMPT) + new_tokens - 2
    assert all(earlier.last < later.last for earlier, later in zip(jobs, jobs[1:]))  # no draft is sent twice


def test_the_drafter_stops_at_a_drafted_stop_token(tiny_target, monkeypatch):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), GREEDY, 20)
    stop = reference[6]
    with dsi_in_turns(tiny_target, tiny_target, workers=1, lookahead=4) as engine:
        engine.stop_ids = frozenset({stop})
        drafted = drafted_positions(engine, monkeypatch)
        tokens, _ = run(engine, GREEDY, 20)
    assert tokens == reference[:reference.index(stop) + 1]
    assert max(drafted) == len(PROMPT) + reference.index(stop)  # the stop is the last draft


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_each_draft_is_the_drafts_own_sample_after_the_tokens_before_it(tiny_target, rough_draft, monkeypatch,
                                                                        sampling):
    """An often wrong drafter, its cache cut back at each rejection: every draft a job carries is
    the draft's sample at its position, checked against one fresh pass of the draft over the job's
    tokens. In fp32 the two passes differ by ~1e-6 (design.md 8): positions whose top two logits
    lie within 1e-4 are left out; a seeded draw could differ only where its uniform falls that
    close to a boundary of the distribution."""
    with dsi_in_turns(tiny_target, rough_draft, workers=1, lookahead=3) as engine:
        jobs = sent_jobs(engine, monkeypatch)
        run(engine, sampling, 30)
    checked = 0
    for job in jobs:
        logits = fresh_logits(rough_draft, job.tokens)
        for position in range(job.first, job.last):
            top = torch.topk(logits[position - 1], 2).values
            if top[0] - top[1] >= NEAR_TIE:
                assert job.tokens[position] == sample_token(logits[position - 1], sampling, position)
                checked += 1
    assert checked > 20 and sum(job.first < len(job.tokens) for job in jobs) > 5


def test_a_draft_after_several_new_tokens_comes_from_the_last_ones_logits(tiny_target, rough_draft):
    """A job that accepts every draft and adds its bonus token leaves the drafter's cache two tokens
    short: the next forward runs both, and only the last row's logits decide the draft (only a
    one-token forward times the drafter's latency)."""
    with dsi(tiny_target, rough_draft, workers=1, lookahead=2) as engine:
        cache = new_cache()
        rough_draft.hidden(torch.tensor(PROMPT[:-2]), torch.arange(len(PROMPT) - 2), cache)
        reply = Reply(list(PROMPT), len(PROMPT), len(PROMPT) + 8)
        for _ in range(2):
            engine.draft_one(reply, cache, SEEDED, Tally())
    logits = fresh_logits(rough_draft, reply.spec)
    positions = [len(PROMPT), len(PROMPT) + 1]
    assert reply.spec[len(PROMPT):] == [sample_token(logits[p - 1], SEEDED, p) for p in positions]
    assert len(engine.latencies.draft_token_s) == 1  # the second forward's, of one token


def test_the_events_account_for_the_reply(tiny_target, tiny_draft, monkeypatch):
    """Jobs counted once each; the drafter's seconds (its prompt's among them) and the waits
    within the reply's wall time; the prompt's tokens on the first event only."""
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=2) as engine:
        jobs = sent_jobs(engine, monkeypatch)
        began = time.perf_counter()
        _, events = run(engine, SEEDED, 30)
        wall = time.perf_counter() - began
    assert sum(event.jobs_submitted for event in events) == len(jobs)
    assert sum(event.draft_s + event.target_s for event in events) <= wall
    assert 0 < events[0].prefill_s <= events[0].draft_s
    assert [event.prefill_tokens for event in events] == [len(PROMPT)] + [0] * (len(events) - 1)


def test_the_worker_bound_waits_for_enough_timings_and_reads_the_recent_ones():
    latencies = Latencies()
    for _ in range(MIN_SAMPLES - 1):
        latencies.job_s.append(1.0)
        latencies.draft_token_s.append(0.1)
    assert latencies.needed_workers(2) is None
    latencies.job_s.append(1.0)
    assert latencies.needed_workers(2) is None  # the drafter's timings are still too few
    latencies.draft_token_s.append(0.1)
    assert latencies.needed_workers(2) == 5  # ceil(1.0 / (2 x 0.1))
    latencies.job_s.extend([0.5] + [2.0] * (RECENT // 2) + [4.0] * (RECENT // 2))
    assert latencies.needed_workers(2) == 15  # median 3.0 of the last RECENT: ceil(3.0 / 0.2)


def test_the_notice_comes_only_when_the_workers_are_fewer_than_the_bound(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=2, lookahead=1) as engine:
        engine.latencies.job_s.extend([1.0] * MIN_SAMPLES)
        engine.latencies.draft_token_s.extend([0.5] * MIN_SAMPLES)
        assert engine.worker_notice() == ""  # ceil(1.0 / 0.5) = 2 workers: enough
        engine.latencies.draft_token_s.extend([0.4] * MIN_SAMPLES)
        assert engine.worker_notice().startswith("dsi: 2 workers, fewer than the 3 ")  # median 0.45: ceil(1.0 / 0.45)
        assert engine.worker_notice() == ""  # once


def test_settings_without_a_lookahead_leave_it(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=1, lookahead=3) as engine:
        engine.apply(LiveSettings(budget=64))
        assert engine.live_settings() == LiveSettings(lookahead=3, workers=1)
        engine.apply(LiveSettings(lookahead=5))
        assert engine.live_settings().lookahead == 5


def test_forms_embeddings_and_scores_are_refused_in_one_line(tiny_target, tiny_draft):
    with dsi(tiny_target, tiny_draft, workers=1, lookahead=3) as engine:
        assert not engine.keeps_forms  # what the server reads to refuse them up front
        with pytest.raises(SpecchatError, match="--engine dsi cannot keep a reply to a grammar, log its"):
            next(engine.generate(PROMPT, 4, SamplingParams(0.0, token_log=TokenLog())))
        with pytest.raises(SpecchatError, match="--engine dsi computes no embeddings"):
            engine.embed(PROMPT, "mean")
        with pytest.raises(SpecchatError, match="--engine dsi scores no prompts"):
            engine.score(PROMPT, 2)
