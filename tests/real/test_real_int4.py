"""The real target run from its stored 4-bit weights (`--weights quantized`) is the dense target.

In float32 each Q4_K linear's kernel weights are the dense conversion's float32 weights bitwise
(checked as it is converted, models/convert_int4.py), so the packed target's logits differ from
the dense one's only by the order its sums run in: its greedy choice is the dense target's at
every position of a prompt. (The shipped bf16 target is tested with every default on, against its
own autoregressive decoding, in test_real_defaults.py.)

torch's fused int4 kernel is scalar in float32 on x86 (~8x a dense float32 matmul per row, and it
grows with the rows), so the prompt's pass runs the chunked product, as the probe picks for wide
inputs: the dense weights rebuilt bitwise a chunk at a time, then a float32 matmul.
"""

import gc

import pytest
import torch
from helpers.q6_linears import read_q6

from specchat.checkpoint.sources import SafetensorsSource
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.dsi.remote import RemoteVerifier
from specchat.models.embedded import ensure_embedded
from specchat.models.loading import load
from specchat.models.marker import is_current_int4
from specchat.models.registry import DEFAULT_TARGET
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_embedding import Int4Embedding
from specchat.quant.widths import WidthChoice
from specchat.runtime import encode_prompt

pytestmark = pytest.mark.real

LINEARS = 168  # the target's Q4_K linears: 28 layers x (q, k, o, gate, up) + 14 v + 14 down (the rest are Q6_K)
PROMPTS = 3


def prompt_logits(model, prompt_ids: list[int]) -> torch.Tensor:
    lm = CausalLM(model)
    return lm.logits(lm.hidden(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), new_cache()))


def test_the_packed_target_scores_prompts_as_the_dense_target(mtbench_prompts):
    dense = load(DEFAULT_TARGET, torch.float32, progress=False)
    prompts = [encode_prompt(dense.tokenizer, prompt, raw=False) for prompt in mtbench_prompts[:PROMPTS]]
    expected = [prompt_logits(dense.model, ids) for ids in prompts]
    del dense
    gc.collect()
    packed = load(DEFAULT_TARGET, torch.float32, progress=False, weights="quantized").model
    linears = [m for m in packed.modules() if isinstance(m, Int4Linear)]
    assert len(linears) == LINEARS and isinstance(packed.get_input_embeddings(), Int4Embedding)
    for linear in linears:
        linear.widths = WidthChoice(0, torch.float32)  # the chunked product at every width
    for ids, reference in zip(prompts, expected):
        logits = prompt_logits(packed, ids)
        difference = (logits - reference).abs().max().item()
        print(f"{len(ids)}-token prompt: max |packed - dense| = {difference:.2e} logits")
        assert difference < 1e-3
        top2 = reference.topk(2).values
        decided = (top2[:, 0] - top2[:, 1]) > 2 * difference  # positions no such difference can flip
        assert torch.equal(logits.argmax(-1)[decided], reference.argmax(-1)[decided])
        assert decided.float().mean() > 0.95


@pytest.mark.parametrize("weights", ["quantized", "dense"])
def test_a_ray_actor_loads_the_target_as_weights_says(weights):
    """dsi's Ray actors load the target themselves (the verifier inside each, run here without
    Ray): from its 4-bit weights when the run's `--weights` resolves to quantized."""
    verifier = RemoteVerifier(DEFAULT_TARGET, torch.bfloat16, "cpu", weights)
    model = verifier.verifier.target.model
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == (LINEARS if weights == "quantized" else 0)


def test_the_4_bit_conversion_holds_the_q6k_head_as_the_dense_weights():
    """The conversion keeps the target's Q6_K LM head as a Q6Weight (for plans short of memory),
    written only because it dequantizes to the dense conversion's float32 head bitwise; checked
    here again on a few slices of rows."""
    directory = ensure_embedded(DEFAULT_TARGET, progress=False, weights="quantized")
    assert is_current_int4(directory)
    source = SafetensorsSource(directory)
    head = read_q6(source.get, "lm_head")
    dense = source.get("lm_head.weight")
    assert head.values.shape == dense.shape == (151936, 1536)
    for rows in (slice(0, 1000), slice(75000, 76000), slice(150936, 151936)):
        assert torch.equal(head.dequantize(rows), dense[rows])
