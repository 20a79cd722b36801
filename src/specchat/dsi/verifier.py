"""What one target worker does: run the target over a job's tokens and sample its token at
every position the job decides. Shared by thread workers and Ray actors.

The worker keeps its KV cache between jobs (and between replies) and recomputes only from the
first token where the new job differs from what it last ran, and at least the row before the
job's first position, whose logits decide that position.
"""

import threading
from time import perf_counter

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache, truncate
from specchat.decoding.sampling import sample_token
from specchat.dsi.jobs import Preempted, VerifyJob


def common_prefix(a: list[int], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TargetVerifier:
    """A target model with its own KV cache that answers verification jobs one at a time.

    `cancel(job_id)` may be called from another thread: the running job stops before its next
    decoder layer with Preempted, and the cache is rolled back to what it held before.
    """

    def __init__(self, target: CausalLM) -> None:
        self.target = target
        self.cache = new_cache()
        self.tokens: list[int] = []  # what the cache holds
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
        """The target's tokens at positions job.first .. job.last, and the seconds it took."""
        start = perf_counter()
        with self.lock:
            # A worker runs one job at a time, so a cancel for any other job arrived after that
            # job had ended: drop it.
            self.cancelled &= {job.id}
            if job.id in self.cancelled:
                raise Preempted(f"job {job.id}")
            self.running = job.id
        keep = min(common_prefix(self.tokens, job.tokens), job.first - 1)
        truncate(self.cache, keep)
        self.tokens = self.tokens[:keep]
        try:
            hidden = self.target.hidden(
                torch.tensor(job.tokens[keep:]), torch.arange(keep, len(job.tokens)), self.cache
            )
        except Preempted:
            truncate(self.cache, keep)
            raise
        finally:
            with self.lock:
                self.running = None
                self.cancelled.discard(job.id)
        self.tokens = list(job.tokens)
        logits = self.target.logits(hidden[job.first - 1 - keep:])
        targets = [sample_token(row, job.sampling, job.first + i) for i, row in enumerate(logits)]
        return targets, perf_counter() - start
