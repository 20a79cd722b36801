"""The default target as a 2 GB container runs it (issue 28): every layer streamed from the disk in
the form the GGUF stores (Q6_K linears, Q4_K scales: quant/q6k_linear.py, q4k_scales.py) and its LM
head kept in Q6_K, under a --ram-budget that leaves the plan no other choice. Specexec over that
target gives its own autoregressive tokens, greedy and seeded, up to bf16's near-ties
(tests/real/test_real_defaults.py says why there are any), on PROMPTS prompts."""

import gc
import math

import pytest
import torch
from helpers.engines import GREEDY
from helpers.exactness import ExactnessCheck
from test_real_defaults import BF16_NEAR_TIES, DEFAULT_SAMPLING, SAMPLING_IDS, SAMPLINGS

from specchat.decoding.events import LiveSettings
from specchat.engine_options import EngineOptions
from specchat.loader import load_models
from specchat.quant.q4k_scales import Q4KScalesLinear
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.widened import widened_rows
from specchat.runtime import encode_prompt

pytestmark = pytest.mark.real

RAM_BUDGET_GB = 1.4  # what a 2 GB container leaves beside specchat's runtime
# Every pass streams all 28 layers (~1.5 s on one core of the AMX Xeon), so replies are short and
# there are more than one: the prompts' passes and first trees (where a misplaced stored form
# would show at once) are checked twice. (3 prompts took 76-88 s a sampling in the two-worker
# suite, 2026-11-29, at its 25-minute edge.)
PROMPTS = 2
NEW_TOKENS = 12
# Near-ties of the compact target (its tree rows and one-token rows multiply the same weights: no
# dense copies for streamed layers). Measured 2026-11-26 on the AMX Xeon, one torch thread
# (scripts/bench_bf16_gaps.py --target compact, docs/bench/bf16-gaps-2026-11-26-compact/): MT-Bench
# first turns 0-3 x 16 tokens, greedy and seeds 0 and 1: greedy none; seeded 1 tie in 8 replies
# (prompt 0, seed 0: gap 0.0027). 2026-11-28 on the project's AMD EPYC (this module's printout, code
# e8d4690): none, greedy or seeded. Seeded: the gap bound 2x the largest, the count the largest plus
# one. Greedy has never tied here: test_real_defaults' greedy gap bound (measured in memory) and
# float32's one tie, the floor of the rule (design.md section 8), not a measurement.
COMPACT_NEAR_TIES = {GREEDY: BF16_NEAR_TIES[GREEDY], DEFAULT_SAMPLING: 0.0054}
COMPACT_MAX_TIES = {GREEDY: 1, DEFAULT_SAMPLING: 1 + 1}


@pytest.fixture(scope="module")
def compact_models(tmp_path_factory):
    options = EngineOptions(offload="disk", resident_layers=0, ram_budget=RAM_BUDGET_GB, budget=16,
                            offload_dir=str(tmp_path_factory.mktemp("layers")))
    models = load_models(options, progress=False)
    yield models
    models.close()
    del models
    gc.collect()


def test_a_tight_budget_streams_the_stored_forms_and_keeps_the_head_compact(compact_models):
    memory = compact_models.memory
    assert memory.compact_layers and memory.compact_head and len(compact_models.placement.streamed) == 28
    assert isinstance(compact_models.target.model.get_output_embeddings(), Q6Linear)
    skeletons = [layer.skeleton for layer in compact_models.target.model.get_decoder().layers]
    q6 = [m for layer in skeletons for m in layer.modules() if isinstance(m, Q6Linear)]
    assert len(q6) == 28  # 14 down, 14 v
    # widened to float32 from this CPU's rows where its bf16 kernel is the slower (quant/widened.py)
    rows = widened_rows(torch.bfloat16)
    assert {m.widened_from for m in q6} == {math.inf if rows is None else rows}
    assert sum(isinstance(m, Q4KScalesLinear) for layer in skeletons for m in layer.modules()) == 168
    assert compact_models.identity["layers"] == compact_models.identity["head"] == "q6_k"


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_specexec_over_the_compact_target_gives_its_autoregressive_tokens(compact_models, mtbench_prompts, sampling):
    check = ExactnessCheck(compact_models.target, compact_models.stop_ids, NEW_TOKENS,
                           near_tie=COMPACT_NEAR_TIES[sampling], max_ties=COMPACT_MAX_TIES[sampling])
    engine = compact_models.engine("specexec", LiveSettings(budget=16))
    for prompt in mtbench_prompts[:PROMPTS]:
        prompt_ids = encode_prompt(compact_models.tokenizer, prompt, raw=False)
        reference = [t for e in compact_models.engine("autoregressive").generate(prompt_ids, NEW_TOKENS, sampling)
                     for t in e.token_ids]
        tokens = [t for e in engine.generate(prompt_ids, NEW_TOKENS, sampling) for t in e.token_ids]
        comparison = check.compare(prompt_ids, reference, tokens, sampling)
        print(f"{len(prompt_ids)}-token prompt, {len(tokens)} tokens: {comparison.describe()}")
        assert comparison.acceptable, comparison.describe()
        assert all(tie.gap <= COMPACT_NEAR_TIES[sampling] for tie in comparison.ties)
