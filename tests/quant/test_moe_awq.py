"""MoE targets from AutoAWQ GEMM checkpoints in its per-expert layout (Mixtral's
`block_sparse_moe.experts.E.w1|w2|w3`, Qwen3-MoE's `mlp.experts.E.gate_proj|up_proj|down_proj`,
the routers left dense): every expert's linears load as Int4Linears, equal to transformers' own
fused experts holding the same 4-bit weights, streamed as in memory, and SpecExec over them exact
(transformers' own reply on those weights)."""

import copy
from pathlib import Path

import pytest
import torch
from helpers.awq_moe_writer import dense_moe_model, write_moe_awq_checkpoint
from helpers.gptq_moe_writer import tiny_moe
from helpers.moe import (SAMPLINGS, assert_experts_equal, assert_routers_kept,
                         assert_specexec_emits_transformers_tokens, assert_streams_the_in_memory_logits, draft_of,
                         loaded, logits, split_linears)
from torch import nn
from transformers import PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.quant.int4 import Int4Linear

FAMILIES = ["mixtral", "qwen3_moe"]  # no Qwen2-MoE AWQ checkpoint is written here (tested as GPTQ)
GROUP = 64  # AutoAWQ's default of 128 is wider than the tiny models' 64 hidden inputs


@pytest.fixture(scope="module", params=FAMILIES)
def moe(request, tmp_path_factory) -> tuple[Path, PreTrainedModel]:
    """(the AWQ directory, transformers' float32 model of the weights it holds)."""
    model = tiny_moe(request.param, 7)
    directory = tmp_path_factory.mktemp(f"{request.param}-awq")
    return directory, dense_moe_model(model, write_moe_awq_checkpoint(request.param, model, directory, GROUP))


def test_every_experts_and_attention_linear_loads_as_an_int4_linear_and_the_router_stays_dense(moe):
    directory, dense = moe
    model = loaded(directory)
    for layer in model.model.layers:
        attention = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj]
        assert all(type(linear) is Int4Linear for linear in split_linears(layer) + attention)
    assert not any(type(m) is nn.Linear for m in model.model.layers.modules())
    assert_routers_kept(model, dense)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_int4_experts_equal_transformers_experts_holding_the_same_weights(moe, layer):
    directory, dense = moe
    # every AWQ weight s * (q - z) is exact in float32 (quant/awq.py), and so in float64
    assert_experts_equal(loaded(directory), copy.deepcopy(dense).double(), layer)


def test_a_loaded_moe_gives_transformers_logits_for_the_same_4bit_weights(moe):
    directory, dense = moe
    # the same weights, summed in another order: float32 rounding only
    torch.testing.assert_close(logits(CausalLM(loaded(directory))), logits(CausalLM(dense)), atol=2e-5, rtol=0)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_streamed_moe_gives_the_in_memory_logits(moe, tmp_path, tier):
    directory, _ = moe
    assert_streams_the_in_memory_logits(directory, tier, tmp_path)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_specexec_over_an_int4_moe_target_emits_transformers_tokens_for_its_weights(moe, sampling):
    directory, dense = moe
    draft = draft_of(copy.deepcopy(dense))  # perturbed in place: the fixture's model stays the checkpoint's
    assert_specexec_emits_transformers_tokens(CausalLM(loaded(directory)), draft, dense, sampling)
