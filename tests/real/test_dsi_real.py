"""DSI on the real embedded Qwen pair in float32 with 2 thread workers: seeded equals seeded
autoregressive, judged by tests/helpers/exactness.py (design.md section 8), and jobs were preempted
along the way. Greedy DSI is tested against autoregressive on the tiny models
(tests/dsi/test_dsi_engine.py); the real pair checks the stronger, seeded claim.

For the first prompt the workers take turns (tests/helpers/dsi_turns.py): a job runs only once the
drafter has filled its window, so that reply's preemptions do not depend on the machine's speed.
The other prompts run on the workers' natural, concurrent schedule (there are none where the
run is scaled down to one prompt: tests/helpers/suite_scale.py; tests/dsi/ runs that schedule on
the tiny models)."""

import pytest
import torch
from helpers.dsi_turns import ScriptedWorker, TurnPool, Turns
from helpers.real_pair import PAPER_SAMPLING, emitted

from specchat.dsi.engine import DSIEngine
from specchat.dsi.workers import thread_workers

pytestmark = pytest.mark.real

WORKERS = [torch.device("cpu")] * 2


@pytest.fixture(scope="module")
def real_dsi(real_pair):
    turns = Turns()
    pool = TurnPool([ScriptedWorker(worker, turns) for worker in thread_workers(real_pair.target, WORKERS)], turns)
    yield DSIEngine(real_pair.draft, pool, real_pair.stop_ids, lookahead=2)
    turns.open()  # closing the pool waits for the jobs still waiting for a turn
    pool.close()


def test_seeded_dsi_equals_seeded_autoregressive(real_check, real_dsi, seeded_references):
    preempted = []
    for prompt_ids, reference in seeded_references:
        tokens, events = emitted(real_dsi, prompt_ids, PAPER_SAMPLING)
        comparison = real_check.compare(prompt_ids, reference, tokens, PAPER_SAMPLING)
        assert comparison.acceptable, comparison.describe()
        preempted.append(sum(e.jobs_preempted for e in events))
        real_dsi.pool.turns.open()  # the first reply took turns; the others run concurrently
    assert preempted[0] > 0, preempted
