"""The default target as a 2 GB container runs it (issue 28): every layer streamed from the disk in
the form the GGUF stores (Q6_K linears, Q4_K scales: quant/q6k_linear.py, q4k_scales.py) and its LM
head kept in Q6_K, under a --ram-budget that leaves the plan no other choice. Greedy specexec over
that target gives its own autoregressive tokens, greedy and seeded, up to bf16's near-ties
(tests/test_real_defaults.py states the bounds and why)."""

import gc

import pytest
from conftest import GREEDY_NEW_TOKENS
from exactness import ExactnessCheck
from test_real_defaults import BF16_MAX_TIES, BF16_NEAR_TIE, SAMPLING_IDS, SAMPLINGS

from specchat.decoding.events import LiveSettings
from specchat.loader import load_models
from specchat.quant.q4k_scales import Q4KScalesLinear
from specchat.quant.q6k_linear import Q6Linear
from specchat.runtime import EngineOptions, encode_prompt

pytestmark = pytest.mark.real

NEW_TOKENS = GREEDY_NEW_TOKENS  # the length BF16_MAX_TIES is stated for
RAM_BUDGET_GB = 1.4  # what a 2 GB container leaves beside specchat's runtime


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
    assert sum(isinstance(m, Q6Linear) for layer in skeletons for m in layer.modules()) == 28  # 14 down, 14 v
    assert sum(isinstance(m, Q4KScalesLinear) for layer in skeletons for m in layer.modules()) == 168
    assert compact_models.identity["layers"] == compact_models.identity["head"] == "q6_k"


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_specexec_over_the_compact_target_gives_its_autoregressive_tokens(compact_models, mtbench_prompts, sampling):
    prompt_ids = encode_prompt(compact_models.tokenizer, mtbench_prompts[0], raw=False)
    reference = [t for e in compact_models.engine("autoregressive").generate(prompt_ids, NEW_TOKENS, sampling)
                 for t in e.token_ids]
    engine = compact_models.engine("specexec", LiveSettings(budget=16))
    tokens = [t for e in engine.generate(prompt_ids, NEW_TOKENS, sampling) for t in e.token_ids]
    check = ExactnessCheck(compact_models.target, compact_models.stop_ids, NEW_TOKENS, near_tie=BF16_NEAR_TIE,
                           max_ties=BF16_MAX_TIES[sampling])
    comparison = check.compare(prompt_ids, reference, tokens, sampling)
    print(f"{len(prompt_ids)}-token prompt, {len(tokens)} tokens: {comparison.describe()}")
    assert comparison.acceptable, comparison.describe()
    assert all(tie.gap <= BF16_NEAR_TIE for tie in comparison.ties)
