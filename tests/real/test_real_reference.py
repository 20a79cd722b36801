"""The autoregressive engine against the independent reference loop (tests/helpers/reference_loop.py:
transformers' forward with its own DynamicCache, its warpers, an inverse CDF written apart, the
(seed, n) draw) on the real target in float32, seeded at the paper's t=0.6, top-p 0.9.

Every seeded exactness test of the other engines compares them with this engine
(helpers/fixtures.py's seeded_references), so this is what ties those tests to sequential sampling as
transformers defines it. A difference passes only at a near-tie under the loop's own logits
(design.md section 8), re-anchored; at most one per prompt, and none occurred when this was
written.
"""

import pytest
from helpers.exactness import MAX_TIES, NEAR_TIE
from helpers.real_pair import PAPER_SAMPLING
from helpers.reference_loop import ties_against_reference
from helpers.suite_scale import scaled

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams

pytestmark = pytest.mark.real

APP_DEFAULT_SAMPLING = SamplingParams(temperature=0.6, top_p=0.9, seed=0)
EXTRA_NEW_TOKENS = scaled(24)  # 12 where the run is scaled down (tests/helpers/suite_scale.py)


def assert_equals_reference(real_pair, prompt_ids: list[int], tokens: list[int], count: int,
                            sampling: SamplingParams) -> int:
    """The engine's `tokens` are the loop's, up to MAX_TIES re-anchored near-ties; returns the ties."""
    ties = ties_against_reference(real_pair.target.model, prompt_ids, tokens, count, sampling.temperature,
                                  sampling.top_p, sampling.seed, real_pair.stop_ids, NEAR_TIE)
    assert len(ties) <= MAX_TIES, ties
    print(f"{len(prompt_ids)}-token prompt, seed {sampling.seed}: {len(tokens)} tokens, ties {ties}")
    return len(ties)


def test_seeded_autoregressive_equals_the_independent_reference(real_pair, seeded_references, mtbench_prompts):
    """The suite's seeded references (GREEDY_PROMPTS MT-Bench prompts x 32 tokens, seed 1234) and
    the third prompt at the app's default seed (0), EXTRA_NEW_TOKENS tokens."""
    count = len(seeded_references[0][1])
    ties = sum(assert_equals_reference(real_pair, prompt_ids, tokens, count, PAPER_SAMPLING)
               for prompt_ids, tokens in seeded_references)
    prompt_ids = real_pair.chat(mtbench_prompts[2])
    engine = AutoregressiveEngine(real_pair.target, real_pair.stop_ids)
    tokens = [t for e in engine.generate(prompt_ids, EXTRA_NEW_TOKENS, APP_DEFAULT_SAMPLING) for t in e.token_ids]
    ties += assert_equals_reference(real_pair, prompt_ids, tokens, EXTRA_NEW_TOKENS, APP_DEFAULT_SAMPLING)
    print(f"ties against the independent reference: {ties} in 3 prompts")
