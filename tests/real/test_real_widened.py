"""The real target's dense bf16 products widened to float32 (quant/widened.py) score prompts as torch's
bf16 kernel does, up to bf16's rounding.

The shipped target in bf16 from its 4-bit weights keeps 29 dense linears (the LM head, 14 layers'
Q6_K down and v projections). Widened, each sums the same bf16 products in float32 and rounds once,
as a bf16 GEMM does, in another order: the logits move by what reordering a bf16 model's sums moves
them, and the greedy choice stays wherever the top two logits are further apart than that. Every
product is widened here (from one row), whatever this CPU measured, so that any machine runs it; on
a CPU without bf16 instructions the app's own replies run it too (test_real_defaults.py).
"""

import pytest
import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_TARGET
from specchat.quant.widened import WidenedLinear, widen, widens
from specchat.runtime import encode_prompt

pytestmark = pytest.mark.real

PROMPTS = 3
DENSE_LINEARS = 29  # the LM head, and 14 layers' Q6_K down and v projections
# How far reordering the 29 linears' sums may move a logit: measured 0.27-0.31 (the AVX2 EPYC,
# 2026-12-01, one and two threads; 2.5 bf16 steps at a logit of 16-32). A product that misplaced a
# chunk or its bias moves logits by tens.
BF16_REORDERED = 1.0
# Greedy choices that such a reordering flips, each a near-tie: measured at most 3 of 51 positions
# (one thread: gaps 0.0625, 0.0625 and 0), 1 of 75 and 1 of 86 (two threads). The bound is twice that share.
FLIPPED_SHARE = 0.12


def prompt_logits(lm: CausalLM, prompt_ids: list[int]) -> torch.Tensor:
    return lm.logits(lm.hidden(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), new_cache())).float()


def test_the_widened_target_scores_prompts_as_the_bf16_kernel(mtbench_prompts):
    loaded = load(DEFAULT_TARGET, torch.bfloat16, progress=False, weights="quantized")
    lm = CausalLM(loaded.model)
    prompts = [encode_prompt(loaded.tokenizer, prompt, raw=False) for prompt in mtbench_prompts[:PROMPTS]]
    plain = [prompt_logits(lm, ids) for ids in prompts]
    dense = [m for m in loaded.model.modules() if widens(m)]
    assert len(dense) == DENSE_LINEARS
    for linear in dense:
        widen(linear, from_rows=1)
    assert sum(isinstance(m, WidenedLinear) for m in loaded.model.modules()) == DENSE_LINEARS
    for ids, reference in zip(prompts, plain):
        logits = prompt_logits(lm, ids)
        difference = (logits - reference).abs().max().item()
        chosen = logits.argmax(-1)
        differs = chosen != reference.argmax(-1)
        # how far behind the kernel's best the widened choice is, under the kernel's own logits
        behind = reference.max(-1).values - reference.gather(-1, chosen[:, None])[:, 0]
        print(f"{len(ids)}-token prompt: max |widened - bf16 kernel| = {difference:.3f} logits, greedy choice "
              f"differs at {int(differs.sum())} of {len(ids)} positions, by {behind[differs].tolist()}")
        assert difference < BF16_REORDERED
        assert (behind[differs] <= 2 * difference).all()  # each a near-tie that such a difference can flip
        assert differs.float().mean() <= FLIPPED_SHARE
