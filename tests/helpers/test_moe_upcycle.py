"""The upcycling writer (tests/helpers/moe_upcycle.py) on a tiny dense Qwen2: its experts differ, each the
MLP less its own channel group, specchat's load of the checkpoint gives the logits of transformers'
model that `dense_reference` reads from it apart from specchat, and a routing error shows in them
(which copies of one MLP, the writer's experts before, would hide)."""

from pathlib import Path

import pytest
import torch
from helpers.moe_upcycle import dense_reference, write_upcycled
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.offload.build import offload_model
from specchat.progress import Reporter

EXPERTS, TOP_K = 8, 2
INTERMEDIATE = 1024  # 8 groups of 128 channels: each expert's linears fit RTN's groups of 128 and the int4 kernels
PROMPT = [3, 14, 15, 9, 26, 5, 40, 41, 77]


@pytest.fixture(scope="module")
def upcycled(tmp_path_factory) -> Path:
    """A 2-layer Qwen2 upcycled in its second layer (the first kept dense), its other linears float16."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=96, hidden_size=128, intermediate_size=INTERMEDIATE, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    root = tmp_path_factory.mktemp("upcycle")
    Qwen2ForCausalLM(config).save_pretrained(root / "dense")
    return write_upcycled(root / "dense", root / "moe", EXPERTS, TOP_K, [1], quantize_dense=False)


def logits(model: PreTrainedModel) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0]


def test_each_expert_is_the_mlp_less_its_own_channel_group(upcycled):
    experts = dense_reference(upcycled, torch.float32).model.layers[1].mlp.experts
    gates = experts.gate_up_proj[:, :INTERMEDIATE]  # [E, I, H]
    width = INTERMEDIATE // EXPERTS
    group = torch.arange(INTERMEDIATE) // width  # each channel's group
    for expert in range(EXPERTS):
        assert torch.equal(gates[expert].abs().sum(dim=1) == 0, group == expert)
        # the rows two experts both keep, the up and the down projections: the same RTN weights in every expert
        both = (group != expert) & (group != (expert + 1) % EXPERTS)
        assert torch.equal(gates[expert][both], gates[(expert + 1) % EXPERTS][both])
        assert torch.equal(experts.gate_up_proj[expert, INTERMEDIATE:], experts.gate_up_proj[0, INTERMEDIATE:])
        assert torch.equal(experts.down_proj[expert], experts.down_proj[0])


def test_specchat_loads_the_upcycled_checkpoint_with_transformers_logits(upcycled):
    model, _ = offload_model(upcycled, "tiny-upcycled", torch.float32, torch.device("cpu"), None, None,
                             Reporter(bars=False))
    lm = CausalLM(model)
    prompt = torch.tensor(PROMPT)
    mine = lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache()))
    # the same 4-bit and float16 weights, summed in another order: float32 rounding only
    torch.testing.assert_close(mine, logits(dense_reference(upcycled, torch.float32)), atol=2e-5, rtol=0)


def test_two_experts_swapped_change_the_logits(upcycled):
    reference = dense_reference(upcycled, torch.float32)
    before = logits(reference)
    experts = reference.model.layers[1].mlp.experts
    for weight in (experts.gate_up_proj, experts.down_proj):
        weight[[0, 1]] = weight[[1, 0]]
    # a token routed to expert 0 or 1 now loses another channel group: far beyond rounding
    assert (logits(reference) - before).abs().max() > 1e-3
