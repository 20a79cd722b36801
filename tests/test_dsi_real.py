"""DSI on the real embedded Qwen pair in float32 with 2 thread workers: greedy equals the
target's greedy output (HF generate), seeded equals seeded autoregressive, both judged by
tests/exactness.py (design.md section 8), and jobs were preempted along the way."""

import pytest
import torch
from conftest import PAPER_SAMPLING
from test_real_exactness import GREEDY, emitted

from specchat.dsi.engine import DSIEngine
from specchat.dsi.workers import WorkerPool, thread_workers

pytestmark = pytest.mark.real

WORKERS = [torch.device("cpu")] * 2


@pytest.fixture(scope="module")
def real_dsi(real_pair):
    pool = WorkerPool(thread_workers(real_pair.target, WORKERS))
    yield DSIEngine(real_pair.draft, pool, real_pair.stop_ids, lookahead=2)
    pool.close()


def test_greedy_dsi_equals_hf_generate(real_check, real_dsi, greedy_references):
    preempted = accepted = 0
    for prompt_ids, reference in greedy_references:
        tokens, events = emitted(real_dsi, prompt_ids, GREEDY)
        comparison = real_check.compare(prompt_ids, reference, tokens, GREEDY)
        assert comparison.acceptable, comparison.describe()
        preempted += sum(e.jobs_preempted for e in events)
        accepted += sum(e.accepted for e in events)
    assert preempted > 0 and accepted > 0


def test_seeded_dsi_equals_seeded_autoregressive(real_check, real_dsi, seeded_references):
    preempted = 0
    for prompt_ids, reference in seeded_references:
        tokens, events = emitted(real_dsi, prompt_ids, PAPER_SAMPLING)
        comparison = real_check.compare(prompt_ids, reference, tokens, PAPER_SAMPLING)
        assert comparison.acceptable, comparison.describe()
        preempted += sum(e.jobs_preempted for e in events)
    assert preempted > 0
