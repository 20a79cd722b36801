"""--offload auto with the real 1.5B target, float32 (issue 16, acceptance 2 on the real pair,
kept short): under --ram-budget values forcing each split, the placement is the one forced, and
with every layer on disk the logits and greedy tokens are the in-memory ones."""

import gc

import pytest
import torch

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.stopping import stop_token_ids
from specchat.engine_options import EngineOptions
from specchat.loader import load_target, plan_run
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_TARGET
from specchat.plan import resolve_weights
from specchat.plan.budget import MemoryPlan
from specchat.progress import Reporter
from specchat.runtime import encode_prompt

pytestmark = pytest.mark.real

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, seed=0)
TOLERANCE = 1e-5
CPU = torch.device("cpu")
QUIET = Reporter(bars=False)
TOKENS = 6


def rows(lm: CausalLM, prompt: list[int]) -> torch.Tensor:
    cache, out, tokens = new_cache(), [], torch.tensor(prompt)
    for step in range(3):
        start = len(prompt) + step - tokens.numel()
        out.append(lm.logits(lm.hidden(tokens, torch.arange(start, start + tokens.numel()), cache)[-1:])[0])
        tokens = out[-1].argmax().view(1)
    return torch.stack(out)


def greedy(lm: CausalLM, stops, prompt: list[int]) -> list[int]:
    return [t for e in AutoregressiveEngine(lm, stops).generate(prompt, TOKENS, GREEDY) for t in e.token_ids]


@pytest.fixture(scope="module")
def reference():
    target = load(DEFAULT_TARGET, torch.float32, progress=False)
    lm, stops = CausalLM(target.model), stop_token_ids(target.model, target.tokenizer)
    prompt = encode_prompt(target.tokenizer, "Write a Python function that adds two numbers.", raw=False)
    result = {"rows": rows(lm, prompt), "tokens": greedy(lm, stops, prompt), "stops": stops, "prompt": prompt}
    del target, lm
    gc.collect()
    return result


def options(offload_dir, budget_bytes: int) -> EngineOptions:
    return resolve_weights(EngineOptions(offload="auto", ram_budget=budget_bytes / 1e9, offload_dir=str(offload_dir),
                                         dtype="float32"))


def plan(options: EngineOptions) -> MemoryPlan:
    return plan_run(options, CPU, False, Reporter(bars=False))


def test_auto_places_the_real_target_as_each_budget_forces_and_computes_as_in_memory(reference, offload_dir):
    unbudgeted = resolve_weights(EngineOptions(offload="auto", offload_dir=str(offload_dir), dtype="float32"))
    whole = plan(unbudgeted).placement  # the target alone: load_target loads no draft
    assert (whole.resident, whole.disk) == (28, 0)  # this machine holds it all, without a budget
    layer, slot = whole.layers[0], whole.slot_bytes
    reserved = whole.needed - sum(whole.layers)
    assert plan(options(offload_dir, whole.needed + layer // 2)).placement.resident == 28
    for count in (8, 0):  # part resident, part on disk; then every layer on disk
        placement = plan(options(offload_dir, reserved + 2 * slot + count * layer + layer // 2)).placement
        assert (placement.resident, placement.ram, placement.disk, placement.slots) == (count, 0, 28 - count, 2)
    # computed with every layer on disk (a split with part resident computes in test_offload_real.py)
    on_disk = options(offload_dir, reserved + 2 * slot + layer // 2)
    target, offload = load_target(on_disk, CPU, torch.float32, plan(on_disk), QUIET)
    try:
        lm = CausalLM(target.model, offload)
        torch.testing.assert_close(rows(lm, reference["prompt"]), reference["rows"], atol=TOLERANCE, rtol=0)
        assert greedy(lm, reference["stops"], reference["prompt"]) == reference["tokens"]
        assert offload.store.reader.direct and lm.transfer_stats().bytes >= offload.pass_bytes
    finally:
        offload.close()
        del target
        gc.collect()
