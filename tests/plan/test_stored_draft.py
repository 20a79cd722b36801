"""A draft stored in 4 bits (GPTQ, AWQ: plan/pair.py): which forms the plan weighs for the kinds
asked, the expanded form's bytes beside a GPU and the fp8 form's against it, worked out from
Llama-3.1-8B's config."""

import pytest
import torch
from helpers.plan_sizes import llama_layer_linears

from specchat.models.configs import read_config
from specchat.plan.pair import draft_candidates, stores_4bit
from specchat.plan.request import Pair

CPU = torch.device("cpu")


@pytest.mark.parametrize(("name", "stored"), [("llama-3.1-8b-awq", True), ("llama-2-70b-gptq", True),
                                              ("llama-2-7b", False), ("qwen2.5-coder-0.5b", False)])
def test_gptq_and_awq_checkpoints_store_4_bits_and_others_do_not(name, stored):
    assert stores_4bit(read_config(name)) is stored


def forms(kinds: tuple[str, ...], device: torch.device = CPU) -> tuple:
    pair = Pair("llama-3.1-70b-awq", torch.bfloat16, draft="llama-3.1-8b-awq", draft_kinds=kinds,
                draft_vocab=32768, context=4096)
    return draft_candidates(pair, device)


@pytest.mark.parametrize(("kinds", "quants"), [
    (("int4",), ("none",)),  # asked for 4 bits (or 8, or NF4): it runs packed, as stored
    (("nf4",), ("none",)),
    (("int8",), ("none",)),
    (("none",), ("none",)),
    (("fp8",), ("fp8",)),  # one kind that is not a 4-bit one: expanded into it
    (("none", "int4"), ("none", "dense")),  # auto on a GPU: packed against expanded ...
    (("none", "int4", "nf4", "fp8"), ("none", "dense", "fp8")),  # ... and fp8 where the GPU multiplies it
])
def test_a_stored_4_bit_draft_is_weighed_in_the_forms_its_kinds_allow(kinds, quants):
    assert tuple(form.quant for form in forms(kinds)) == quants


def test_the_fp8_form_is_the_expanded_one_with_its_linears_at_a_byte_a_weight_and_a_scale_a_row():
    """Llama-3.1-8B: 32 layers of linears (hidden 4096, MLP 14336, 8 KV heads) from bf16 to fp8, each
    output row given a float32 scale; both expanded a layer at a time on the device, not through RAM."""
    _, dense, fp8 = forms(("none", "int4", "fp8"))
    linears = llama_layer_linears(4096, 14336, 8)
    weights = 32 * sum(inputs * outputs for inputs, outputs in linears)
    rows = 32 * sum(outputs for _, outputs in linears)
    assert dense.weights - fp8.weights == weights * (2 - 1) - rows * 4
    assert dense.load_bytes == fp8.load_bytes == 0 and dense.prepare_bytes == fp8.prepare_bytes > 0


def test_beside_a_gpu_the_expanded_form_holds_its_input_embedding_on_the_host_and_the_head_asked_for():
    """Llama-3.1-8B expanded to bf16 on a GPU: its 32 layers' linears at 2 bytes a weight, the LM head
    cut to the 32768 tokens asked (draft_vocab), 65 norms of 4096, the rotary's two float32 tables of 64;
    its untied input embedding (128256 x 4096) is read a row a token, held on the host."""
    _, dense = forms(("none", "int4"), torch.device("cuda"))
    weights = 32 * sum(inputs * outputs for inputs, outputs in llama_layer_linears(4096, 14336, 8))
    assert dense.quant == "dense" and dense.host_embedding == 128256 * 4096 * 2
    assert dense.weights == 2 * weights + 2 * 32768 * 4096 + 2 * 65 * 4096 + 2 * 64 * 4
