"""TargetVerifier (dsi/verifier.py) on the tiny target: exact target tokens, KV cache reuse between
jobs, and preemption (before a job starts and between decoder layers) with the cache rolled back."""

from time import perf_counter

import pytest
from helpers.engines import GREEDY, PROMPT, fresh_logits
from helpers.tiny import build_tiny

from specchat.capture_gate import CaptureGate
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.kvcache import cache_length
from specchat.decoding.sampling import sample_token
from specchat.dsi.jobs import Preempted, VerifyJob
from specchat.decoding.prefix import common_prefix
from specchat.dsi import verifier as dsi_verifier
from specchat.dsi.verifier import TargetVerifier

SAMPLINGS = [GREEDY, SamplingParams(0.8, 0.95, seed=3), SamplingParams(1.2, 1.0, seed=17)]
NEW_TOKENS = 14


@pytest.fixture
def verifier() -> TargetVerifier:
    """A verifier over its own copy of the tiny target (same seed, so the same weights): its
    cancel hooks must not stay on the session's `tiny_target`."""
    return TargetVerifier(build_tiny(0))


@pytest.fixture
def forwards(verifier, monkeypatch) -> list[tuple[int, list[int]]]:
    """(cache length on entry, positions) of every forward the verifier runs."""
    calls = []
    hidden = verifier.target.hidden

    def spy(tokens, positions, cache, mask=None):
        calls.append((cache_length(cache), positions.tolist()))
        return hidden(tokens, positions, cache, mask)

    monkeypatch.setattr(verifier.target, "hidden", spy)
    return calls


def sequential(model, sampling: SamplingParams, prompt: list[int] = PROMPT, new_tokens: int = NEW_TOKENS) -> list[int]:
    """The reply sequential decoding gives: ref[i] is the token at position len(prompt) + i."""
    events = AutoregressiveEngine(model, stop_ids=[]).generate(prompt, new_tokens, sampling)
    return [t for e in events for t in e.token_ids]


def fresh_targets(model, job: VerifyJob) -> list[int]:
    """The target's token at each of the job's positions from one pass over an empty cache."""
    logits = fresh_logits(model, job.tokens)[job.first - 1:]
    return [sample_token(row, job.sampling, job.first + i) for i, row in enumerate(logits)]


def make_job(job_id: int, committed: list[int], drafts: list[int], sampling: SamplingParams = GREEDY) -> VerifyJob:
    return VerifyJob(job_id, tuple(committed + drafts), len(committed), sampling)


def assert_cache_holds(verifier: TargetVerifier, length: int) -> None:
    layers = [layer for layer in verifier.history.caches[0].layers if layer.is_initialized]
    assert layers, "the cache was never written"
    for layer in layers:
        assert layer.keys.shape[-2] == length and layer.values.shape[-2] == length


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_correct_drafts_give_the_sequential_tokens(verifier, tiny_target, sampling):
    ref = sequential(tiny_target, sampling)
    job = make_job(0, PROMPT + ref[:3], ref[3:7], sampling)
    began = perf_counter()
    targets, seconds = verifier.verify(job)
    assert targets == ref[3:8]  # positions first .. last: four drafts confirmed and the bonus
    assert 0 < seconds <= perf_counter() - began  # the job's own time, within what the call took
    assert verifier.history.tokens == list(job.tokens)
    assert cache_length(verifier.history.caches[0]) == len(job.tokens)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_wrong_draft_targets_up_to_it_are_sequential(verifier, tiny_target, sampling):
    ref = sequential(tiny_target, sampling)
    wrong = (ref[4] + 1) % 50
    job = make_job(0, PROMPT + ref[:3], [ref[3], wrong, ref[5]], sampling)
    targets, _ = verifier.verify(job)
    assert targets[:2] == ref[3:5]  # positions 9 and 10 see only committed or correct tokens
    assert targets == fresh_targets(tiny_target, job)  # beyond, the target given the wrong draft


def test_zero_draft_job_is_one_sequential_step(verifier, tiny_target):
    ref = sequential(tiny_target, GREEDY)
    assert verifier.verify(make_job(0, PROMPT, []))[0] == ref[:1]
    assert verifier.verify(make_job(1, PROMPT + ref[:1], []))[0] == ref[1:2]


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_job_extending_the_last_reuses_the_cache(verifier, tiny_target, forwards, sampling):
    ref = sequential(tiny_target, sampling)
    first = make_job(0, PROMPT + ref[:1], ref[1:3], sampling)  # tokens up to position 8
    assert verifier.verify(first)[0] == ref[1:4]
    second = make_job(1, PROMPT + ref[:5], ref[5:8], sampling)  # frontier 11
    targets, _ = verifier.verify(second)
    assert targets == ref[5:9]
    # only the tokens after the first job's 9 were run, over its 9 cached slots
    assert forwards == [(0, list(range(9))), (9, list(range(9, 14)))]
    assert verifier.history.tokens == list(second.tokens)
    assert cache_length(verifier.history.caches[0]) == len(second.tokens) == 14
    assert_cache_holds(verifier, 14)


def test_same_job_twice_recomputes_only_the_row_before_first(verifier, tiny_target, forwards):
    ref = sequential(tiny_target, GREEDY)
    job = make_job(0, PROMPT + ref[:2], ref[2:5])
    once, _ = verifier.verify(job)
    again, _ = verifier.verify(VerifyJob(1, job.tokens, job.first, GREEDY))
    assert once == again == ref[2:6]
    # the logits at first - 1 decide position `first`, so that row is recomputed
    assert forwards[1] == (job.first - 1, list(range(job.first - 1, len(job.tokens))))
    assert cache_length(verifier.history.caches[0]) == len(job.tokens)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_job_with_a_different_suffix_cuts_the_cache_back(verifier, tiny_target, forwards, sampling):
    ref = sequential(tiny_target, sampling)
    wrong = (ref[3] + 1) % 50
    rejected = make_job(0, PROMPT + ref[:2], [ref[2], wrong, ref[4]], sampling)  # differs at position 9
    verifier.verify(rejected)
    assert cache_length(verifier.history.caches[0]) == 11
    retry = make_job(1, PROMPT + ref[:5], ref[5:7], sampling)
    targets, _ = verifier.verify(retry)
    assert targets == ref[5:8]
    assert common_prefix(list(rejected.tokens), retry.tokens) == 9
    assert forwards[1] == (9, list(range(9, 13)))  # cut back to the common prefix, then rerun
    assert verifier.history.tokens == list(retry.tokens)
    assert_cache_holds(verifier, 13)


def test_shorter_job_after_a_longer_one(verifier, tiny_target, forwards):
    """A job whose tokens are a prefix of what the cache holds (an older, shorter speculation)."""
    ref = sequential(tiny_target, GREEDY)
    verifier.verify(make_job(0, PROMPT + ref[:4], ref[4:8]))
    short = make_job(1, PROMPT + ref[:1], ref[1:2])
    assert verifier.verify(short)[0] == ref[1:3]
    assert forwards[1] == (6, [6, 7])
    assert verifier.history.tokens == list(short.tokens)
    assert_cache_holds(verifier, 8)


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ([], (), 0),
        ([], (1, 2), 0),
        ([1, 2, 3], (1, 2, 3), 3),
        ([1, 2, 3], (1, 2), 2),
        ([1, 2], (1, 2, 5), 2),
        ([1, 9, 3], (1, 2, 3), 1),
        ([5], (6,), 0),
    ],
)
def test_common_prefix(a, b, expected):
    assert common_prefix(a, b) == expected


def test_job_cancelled_before_it_starts_is_preempted(verifier, tiny_target, forwards):
    ref = sequential(tiny_target, GREEDY)
    verifier.verify(make_job(0, PROMPT, ref[:2]))
    verifier.cancel(1)
    with pytest.raises(Preempted):
        verifier.verify(make_job(1, PROMPT + ref[:2], ref[2:4]))
    assert len(forwards) == 1  # it never ran
    # the cache was left as it was, and still matches the tokens it holds
    assert cache_length(verifier.history.caches[0]) == len(verifier.history.tokens) == 8
    assert verifier.history.tokens == PROMPT + ref[:2]
    assert verifier.verify(make_job(2, PROMPT + ref[:2], ref[2:4]))[0] == ref[2:5]


def test_a_job_drops_the_cancels_of_other_jobs(verifier, tiny_target):
    """A worker runs one job at a time, so when a job starts, a cancel for any other job came
    after that job ended (the pool cancels only jobs it has started): it must not linger."""
    ref = sequential(tiny_target, GREEDY)
    verifier.cancel(0)  # arrives before job 0 starts
    verifier.cancel(3)  # stale
    with pytest.raises(Preempted):
        verifier.verify(make_job(0, PROMPT, ref[:2]))
    assert verifier.verify(make_job(1, PROMPT, ref[:2]))[0] == ref[:3]
    assert verifier.cancelled == set()
    assert verifier.verify(make_job(3, PROMPT + ref[:1], ref[1:3]))[0] == ref[1:4]


def layers_of(verifier: TargetVerifier):
    return verifier.target.model.get_decoder().layers


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLINGS[1]])
def test_cancel_between_layers_rolls_every_layer_back(verifier, tiny_target, forwards, cached, sampling):
    """A cancel arriving while layer 0 runs: layer 0's cache has grown, layer 1's check raises."""
    ref = sequential(tiny_target, sampling)
    before = 0
    if cached:
        earlier = make_job(0, PROMPT + ref[:1], ref[1:3], sampling)
        verifier.verify(earlier)
        before = len(earlier.tokens)
    job = make_job(1, PROMPT + ref[:4], ref[4:7], sampling)  # keeps all `before` slots: first - 1 >= before
    grown = []

    def cancel_now(_module, _args):  # runs after the verifier's own check on layer 0
        verifier.cancel(job.id)

    def record(_module, _args, _output):
        grown.append(verifier.history.caches[0].layers[0].keys.shape[-2])

    handles = [layers_of(verifier)[0].register_forward_pre_hook(cancel_now),
               layers_of(verifier)[0].register_forward_hook(record)]
    try:
        with pytest.raises(Preempted):
            verifier.verify(job)
    finally:
        for handle in handles:
            handle.remove()
    assert grown == [len(job.tokens)]  # layer 0 did write the job's slots before the cancel
    written = [layer for layer in verifier.history.caches[0].layers if layer.is_initialized]
    assert len(written) == (2 if cached else 1)  # from an empty cache, layer 1 was never reached
    for layer in written:
        assert layer.keys.shape[-2] == before and layer.values.shape[-2] == before
    assert cache_length(verifier.history.caches[0]) == before
    assert verifier.history.tokens == list(job.tokens)  # of which the cache holds the first `before`
    assert verifier.running is None and verifier.cancelled == set()
    # the next job (the same tokens, a new id) is exact and reuses what was kept
    retry = VerifyJob(2, job.tokens, job.first, sampling)
    assert verifier.verify(retry)[0] == ref[4:8]
    assert forwards[-1] == (before, list(range(before, len(job.tokens))))
    assert_cache_holds(verifier, len(job.tokens))


def test_cancel_hook_on_the_last_layer_is_too_late(verifier, tiny_target):
    """A cancel arriving at the last layer's pre-hook, after the verifier's check there, finds no
    later layer to stop at: the job completes and its tokens stand (the pool discards them)."""
    ref = sequential(tiny_target, GREEDY)
    job = make_job(0, PROMPT, ref[:2])
    handle = layers_of(verifier)[-1].register_forward_pre_hook(lambda _m, _a: verifier.cancel(job.id))
    try:
        assert verifier.verify(job)[0] == ref[:3]
    finally:
        handle.remove()
    assert verifier.cancelled == set()
    assert cache_length(verifier.history.caches[0]) == len(job.tokens)


def test_other_errors_mid_forward_leave_a_usable_verifier(verifier, tiny_target):
    ref = sequential(tiny_target, GREEDY)
    verifier.verify(make_job(0, PROMPT, ref[:2]))

    def explode(_module, _args):
        raise RuntimeError("boom")

    handle = layers_of(verifier)[1].register_forward_pre_hook(explode)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            verifier.verify(make_job(1, PROMPT + ref[:2], ref[2:5]))
    finally:
        handle.remove()
    assert verifier.running is None
    assert verifier.verify(make_job(2, PROMPT + ref[:3], ref[3:5]))[0] == ref[3:6]
    assert_cache_holds(verifier, len(PROMPT) + 5)


def test_stale_cancel_does_not_preempt_a_later_engines_job(verifier, tiny_target):
    ref = sequential(tiny_target, GREEDY)
    job = make_job(7, PROMPT, ref[:2])
    verifier.verify(job)
    verifier.cancel(7)  # the pool cancels job 7 at the end of the reply, just after it finished
    # a new engine over the same workers: its ids start again at 0
    assert verifier.verify(make_job(0, PROMPT, ref[:1]))[0] == ref[:2]
    assert verifier.verify(make_job(7, PROMPT + ref[:2], ref[2:3]))[0] == ref[2:4]


def test_a_job_runs_inside_the_capture_gate(verifier, tiny_target, monkeypatch):
    """Each decoder layer of a job runs while the job holds the process's capture gate, so the
    drafter's CUDA capture never overlaps its synchronizations and allocations (capture_gate.py)."""
    gate, held = CaptureGate(), []
    monkeypatch.setattr(dsi_verifier, "GATE", gate)
    for layer in layers_of(verifier):
        layer.register_forward_pre_hook(lambda module, args: held.append(gate.working))
    ref = sequential(tiny_target, GREEDY)
    assert verifier.verify(make_job(0, PROMPT, ref[:2]))[0] == ref[:3]
    assert held and set(held) == {1} and gate.working == 0
