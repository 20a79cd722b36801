"""What one target worker does: run the target over a job's tokens and sample its token at
every position the job decides. Shared by thread workers and Ray actors.

The worker keeps its KV cache between jobs (and between replies) in a `PrefixCache` and
recomputes only from the first token where the new job differs from what it last ran, and at
least the row before the job's first position, whose logits decide that position.
"""

import threading

import torch

from specchat.capture_gate import GATE
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import truncate
from specchat.decoding.prefix import PrefixCache
from specchat.decoding.sampling import sample_token
from specchat.device_clock import now
from specchat.dsi.jobs import Preempted, VerifyJob


class TargetVerifier:
    """A target model with its own KV cache that answers verification jobs one at a time.

    `cancel(job_id)` may be called from another thread: the running job stops before its next
    decoder layer with Preempted, and the cache is rolled back to what it held before.
    """

    def __init__(self, target: CausalLM) -> None:
        self.target = target
        self.history = PrefixCache(1)
        self.running: int | None = None
        self.cancelled: set[int] = set()
        self.lock = threading.Lock()
        for layer in target.model.get_decoder().layers:
            layer.register_forward_pre_hook(self.check_cancelled)

    def check_cancelled(self, _module, _args) -> None:
        with self.lock:
            if self.running in self.cancelled:
                raise Preempted(f"job {self.running}")

    def cancel(self, job_id: int) -> None:
        with self.lock:
            self.cancelled.add(job_id)

    def verify(self, job: VerifyJob) -> tuple[list[int], float]:
        """The target's tokens at positions job.first .. job.last, and the seconds it took; never
        while the drafter captures a step on the device (capture_gate.py: the job synchronizes it)."""
        with GATE.work():
            return self.run_job(job)

    def run_job(self, job: VerifyJob) -> tuple[list[int], float]:
        start = now(self.target.device)
        with self.lock:
            # A worker runs one job at a time, so a cancel for any other job arrived after that
            # job had ended: drop it.
            self.cancelled &= {job.id}
            if job.id in self.cancelled:
                raise Preempted(f"job {job.id}")
            self.running = job.id
        reuse = self.history.begin(job.tokens, job.first - 1)
        keep, (cache,) = reuse.reused, reuse.caches
        try:
            hidden = self.target.hidden(torch.tensor(job.tokens[keep:]), torch.arange(keep, len(job.tokens)), cache)
        except BaseException:  # Preempted, or any error between layers
            truncate(cache, keep)  # the layers the job reached hold more than the others
            raise
        finally:
            with self.lock:
                self.running = None
                self.cancelled.discard(job.id)
        logits = self.target.logits(hidden[job.first - 1 - keep:])
        targets = [sample_token(row, job.sampling, job.first + i) for i, row in enumerate(logits)]
        return targets, now(self.target.device) - start
