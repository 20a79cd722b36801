"""The DSI engine: the drafter drafts without waiting while target workers verify.

Schedule (the simulator's, simulate/dsi.py): the drafter drafts one token at a time after the
committed tokens and its earlier drafts, up to a window of lookahead x (workers + 1) drafts. A
verification job is sent
  (1) whenever k = lookahead drafts exist beyond the longest live job, and
  (2) at once, with the drafts there are (possibly none: the target alone, as non-SI decodes),
      whenever no job is live, so the target never idles waiting for k drafts.
Jobs queue for the workers first-in first-out. Whenever a finished job decides tokens
(dsi/jobs.py), they are committed; on the first rejected draft, the drafts beyond it are
dropped, drafting restarts from the target's token, and every job built on a rejected draft is
cancelled (preempted) whether it waits or runs. A job that can no longer decide anything because
the frontier passed it is cancelled too, but not counted as preempted.

Each event is one finished job whose tokens were committed: its drafts are the "tree", and
draft_s / target_s are the drafter's time and the time spent waiting for workers since the
previous event. The drafter samples with the target's own per-position uniforms, so where the
two distributions agree the draft is the token the target will pick.
"""

import math
from collections import deque
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from statistics import median
from time import perf_counter

import torch

from specchat.decoding.events import IterationEvent, LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length, truncate
from specchat.decoding.prefix import PrefixCache, Reuse, with_prefill
from specchat.decoding.sampling import sample_token
from specchat.decoding.token_log import TokenLogprobs
from specchat.device_clock import now
from specchat.errors import SpecchatError
from specchat.dsi.jobs import VerifyJob, builds_on_rejected, decided_tokens, is_live
from specchat.dsi.workers import WorkerPool

MIN_SAMPLES = 4  # jobs and single-token drafts timed before judging the worker count
RECENT = 64  # timings kept for it


@dataclass
class Reply:
    """One reply being decoded: `spec` is the committed tokens, then the drafts beyond them."""

    spec: list[int]
    committed: int
    limit: int  # len(prompt) + max_new_tokens

    def committed_tokens(self) -> list[int]:
        return self.spec[: self.committed]


@dataclass
class Tally:
    """What happened since the last event."""

    submitted: int = 0
    preempted: int = 0
    draft_s: float = 0.0
    wait_s: float = 0.0


@dataclass
class Latencies:
    """Timings for the paper's worker bound; kept across replies."""

    job_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    draft_token_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    def needed_workers(self, lookahead: int) -> int | None:
        """ceil(target latency / (k x drafter latency)); None until enough is timed."""
        if len(self.job_s) < MIN_SAMPLES or len(self.draft_token_s) < MIN_SAMPLES:
            return None
        return math.ceil(median(self.job_s) / (lookahead * median(self.draft_token_s)))


class DSIEngine:
    name = "dsi"
    keeps_forms = False  # jobs verify drafts apart: no grammar or token log is kept (generate refuses them)

    def __init__(self, draft: CausalLM, pool: WorkerPool, stop_ids: Collection[int], lookahead: int) -> None:
        self.draft = draft
        self.pool = pool
        self.stop_ids = frozenset(stop_ids)
        self.lookahead = lookahead  # read at every job, so a live change applies at once
        self.latencies = Latencies()
        self.noticed = False
        self.history = PrefixCache(1)  # the drafter's cache

    def live_settings(self) -> LiveSettings:
        return LiveSettings(lookahead=self.lookahead, workers=len(self.pool.workers))

    def apply(self, settings: LiveSettings) -> None:
        if settings.lookahead is not None:
            self.lookahead = settings.lookahead

    def forget(self) -> None:
        """Drop the drafter's kept cache; the workers keep theirs, which each job cuts to the
        prefix it shares (dsi/verifier.py)."""
        self.history.forget()

    def embed(self, token_ids: list[int], pooling: str) -> torch.Tensor:
        raise SpecchatError("--engine dsi computes no embeddings (its target runs in its workers): serve with "
                            "specexec or autoregressive")

    def score(self, token_ids: list[int], top: int) -> list[TokenLogprobs]:
        raise SpecchatError("--engine dsi scores no prompts (its target runs in its workers): serve with "
                            "specexec or autoregressive")

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        if sampling.has_forms:
            raise SpecchatError("--engine dsi cannot keep a reply to a grammar, log its tokens' probabilities, "
                                "penalize repeats or sample by mirostat: use specexec or autoregressive")
        yield from self.history.guard(self.decode(self.history.begin(prompt_ids), max_new_tokens, sampling))

    def decode(self, reuse: Reuse, max_new_tokens: int, sampling: SamplingParams) -> Iterator[IterationEvent]:
        """The drafter's cache follows `reply.spec` (committed tokens and drafts) and is kept
        for the next reply."""
        spec, (cache,) = reuse.tokens, reuse.caches
        reply, tally = Reply(spec, len(spec), len(spec) + max_new_tokens), Tally()
        # Jobs of a reply whose generator was dropped without being closed built on another
        # prefix: they must not count as live here.
        self.pool.cancel({job.id for job in self.pool.live_jobs()})
        prefill_s = self.prefill(spec, cache)
        tally.draft_s += prefill_s
        try:
            while True:
                for job, (targets, seconds) in self.next_results(reply, cache, sampling, tally):
                    self.latencies.job_s.append(seconds)
                    tokens = decided_tokens(job, targets, reply.committed_tokens(), self.stop_ids)
                    if tokens:
                        event = self.commit(reply, cache, job, tokens, tally)
                        if prefill_s is not None:  # the reply's first event
                            event, prefill_s = with_prefill(event, reuse, prefill_s), None
                        tally = Tally()
                        yield event
                        if event.finished:
                            return
        finally:
            self.pool.cancel({job.id for job in self.pool.live_jobs()})

    def prefill(self, spec: list[int], cache) -> float:
        """Run the prompt past the drafter's reused prefix, all but its last token (the first
        draft's input); returns the seconds it took."""
        start, cached = now(self.draft.device), cache_length(cache)
        if cached < len(spec) - 1:
            self.draft.hidden(torch.tensor(spec[cached:-1]), torch.arange(cached, len(spec) - 1), cache)
        return now(self.draft.device) - start

    def next_results(self, reply: Reply, cache, sampling: SamplingParams, tally: Tally) -> list:
        """Send due jobs and draft until some job finishes; wait for one when drafting is done."""
        while not (results := self.pool.collect(block=False)):
            self.send_due_jobs(reply, sampling, tally)
            if not self.can_draft(reply):
                start = perf_counter()  # a host wait: the results are tokens already on the host
                results = self.pool.collect(block=True)
                tally.wait_s += perf_counter() - start
                return results
            self.draft_one(reply, cache, sampling, tally)
        return results

    def send_due_jobs(self, reply: Reply, sampling: SamplingParams, tally: Tally) -> None:
        live = self.pool.live_jobs()
        covered = max((len(job.tokens) for job in live), default=None)
        if covered is None or len(reply.spec) - covered >= self.lookahead:
            self.pool.submit(VerifyJob(self.pool.next_job_id(), tuple(reply.spec), reply.committed, sampling))
            tally.submitted += 1

    def can_draft(self, reply: Reply) -> bool:
        window = self.lookahead * (len(self.pool.workers) + 1)
        spec = reply.spec
        # a draft at position limit - 1 would decide nothing: the job before it already does
        return len(spec) - reply.committed < window and len(spec) < reply.limit - 1 and spec[-1] not in self.stop_ids

    def draft_one(self, reply: Reply, cache, sampling: SamplingParams, tally: Tally) -> None:
        start = now(self.draft.device)
        spec, cached = reply.spec, cache_length(cache)
        hidden = self.draft.hidden(torch.tensor(spec[cached:]), torch.arange(cached, len(spec)), cache)
        spec.append(sample_token(self.draft.logits(hidden[-1:])[0], sampling, len(spec)))
        elapsed = now(self.draft.device) - start
        tally.draft_s += elapsed
        if len(spec) - 1 - cached == 1:  # one token through the draft: its per-token latency
            self.latencies.draft_token_s.append(elapsed)

    def commit(self, reply: Reply, cache, job: VerifyJob, tokens: list[int], tally: Tally) -> IterationEvent:
        """Append the decided tokens, drop rejected drafts, cancel the jobs that built on them. No
        job decides past the limit: none holds a draft at the reply's last position (can_draft)."""
        spec = reply.spec
        for token in tokens:
            position = reply.committed
            if position >= len(spec) or spec[position] != token:
                del spec[position:]
                spec.append(token)
                truncate(cache, position)
            reply.committed += 1
        committed = reply.committed_tokens()
        dead = [j for j in self.pool.live_jobs() if not is_live(j, committed)]
        tally.preempted += self.pool.cancel({j.id for j in dead if builds_on_rejected(j, committed)})
        self.pool.cancel({j.id for j in dead})  # the rest were passed by the frontier
        finished = tokens[-1] in self.stop_ids or reply.committed >= reply.limit
        if finished:
            self.pool.cancel({j.id for j in self.pool.live_jobs()})
        event = IterationEvent(
            token_ids=tokens, accepted=len(tokens) - 1, tree_size=job.drafts, depth=job.drafts,
            draft_s=tally.draft_s, target_s=tally.wait_s,
            jobs_submitted=tally.submitted, jobs_preempted=tally.preempted,
            jobs_in_flight=len(self.pool.live_jobs()), finished=finished, notice=self.worker_notice(),
        )
        return event

    def worker_notice(self) -> str:
        """Once per engine: a remark when fewer workers than the paper's bound were given."""
        needed = self.latencies.needed_workers(self.lookahead)
        workers = len(self.pool.workers)
        if self.noticed or needed is None or workers >= needed:
            return ""
        self.noticed = True
        return (f"dsi: {workers} worker{'s' if workers != 1 else ''}, fewer than the {needed} that keep up with this drafter at lookahead "
                f"{self.lookahead} (ceil(target latency / (k x drafter latency))); verification jobs will queue")
