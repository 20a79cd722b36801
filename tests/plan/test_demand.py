"""A draft's weights as each form stores them, counted on its config before anything loads
(plan/demand.py), worked out here by hand for a tiny Llama: vocab 64, hidden 32, MLP 64, 2 layers,
4 heads of 8 dimensions and 2 key/value heads. A layer's seven linears hold 9216 weights in 256
output rows (q 32x32, k and v 16x32, o 32x32, gate and up 64x32, down 32x64); the embedding and the
head 64x32 = 2048 each; the norms 2 x 32 a layer and 32 at the end = 160; the rotary frequencies
two float32 buffers of 4 (32 bytes), kept in their own dtype."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specchat.plan.demand import (
    ModelShape,
    draft_weight_bytes,
    expanding_bytes,
    layer_linears,
    rounded_workspace,
    shape_of,
)
from specchat.quant.int4 import workspace_bytes
from specchat.quant.int4_rtn import group_for

BF16 = torch.bfloat16
LINEAR_WEIGHTS, LINEAR_ROWS = 2 * 9216, 2 * 256
TABLE, NORMS, BUFFERS = 64 * 32, 160, 32
INT8_TABLE = TABLE + 64 * 4  # an int8 byte a weight and a float32 scale a row


def tiny_llama(tied: bool = False, hidden: int = 32, mlp: int = 64, heads: int = 4,
               kv_heads: int = 2) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied)
    with torch.device("meta"):
        return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def untied() -> LlamaForCausalLM:
    return tiny_llama(tied=False)


@pytest.fixture(scope="module")
def tied() -> LlamaForCausalLM:
    return tiny_llama(tied=True)


def test_full_weights_are_every_parameter_in_the_dtype_and_every_buffer_in_its_own(untied):
    assert draft_weight_bytes(untied, BF16, "none") == 2 * (LINEAR_WEIGHTS + 2 * TABLE + NORMS) + BUFFERS
    assert draft_weight_bytes(untied, torch.float32, "none") == 4 * (LINEAR_WEIGHTS + 2 * TABLE + NORMS) + BUFFERS


def test_int8_stores_the_linears_the_embedding_and_the_head_as_rows_of_bytes_with_a_scale_each(untied):
    linears = LINEAR_WEIGHTS + 4 * LINEAR_ROWS
    assert draft_weight_bytes(untied, BF16, "int8") == linears + 2 * INT8_TABLE + 2 * NORMS + BUFFERS
    # dense copies of the linears, kept for wide steps, beside their int8 rows
    assert draft_weight_bytes(untied, BF16, "int8", dense_kept=True) == \
        linears + 2 * LINEAR_WEIGHTS + 2 * INT8_TABLE + 2 * NORMS + BUFFERS


def test_fp8_and_nf4_round_only_the_decoders_linears(untied):
    tables = 2 * (2 * TABLE + NORMS) + BUFFERS
    assert draft_weight_bytes(untied, BF16, "fp8") == LINEAR_WEIGHTS + 4 * LINEAR_ROWS + tables
    assert draft_weight_bytes(untied, BF16, "nf4") == LINEAR_WEIGHTS * (0.5 + 4 / 64) + tables


@pytest.mark.parametrize("quant, row_bytes", [("none", 2 * 32), ("int8", 32 + 4)])
def test_a_sub_vocabulary_head_replaces_an_untied_head_by_its_rows(untied, quant, row_bytes):
    whole = draft_weight_bytes(untied, BF16, quant)
    head = 2 * TABLE if quant == "none" else INT8_TABLE
    assert draft_weight_bytes(untied, BF16, quant, head_rows=16) == whole - head + 16 * row_bytes
    assert draft_weight_bytes(untied, BF16, quant, head_rows=64) == whole  # the whole vocabulary: the head itself


def test_a_head_tied_to_the_embedding_is_counted_once_and_copied_only_when_it_changes(tied):
    """Full weights share the table; a sub-vocabulary head is a copy of its rows beside the whole
    table, which the embedding still reads; int8 gives the head an int8 copy of its own."""
    shared = 2 * (LINEAR_WEIGHTS + TABLE + NORMS) + BUFFERS
    assert draft_weight_bytes(tied, BF16, "none") == shared
    assert draft_weight_bytes(tied, BF16, "none", head_rows=64) == shared
    assert draft_weight_bytes(tied, BF16, "none", head_rows=16) == shared + 16 * 2 * 32
    assert draft_weight_bytes(tied, BF16, "int8") == LINEAR_WEIGHTS + 4 * LINEAR_ROWS + 2 * INT8_TABLE + 2 * NORMS \
        + BUFFERS


def test_a_dense_models_shape_has_no_router(untied):
    assert shape_of(untied.config, BF16).router_bytes(100) == 0
    assert ModelShape(heads=2, kv_heads=1, head_dim=4, hidden=8, intermediate=16, kv_per_token=64,
                      itemsize=2).router_bytes(100) == 0


def test_expanding_a_4_bit_draft_holds_a_layers_packed_weights_and_its_largest_linears_temporaries(untied):
    """A layer's 9216 weights packed at 0.625 bytes (a nibble, and a bf16 scale and zero a group of
    32), and for each weight of its largest linear (2048, gate, up or down) a float32 value, two
    nibble bytes and two copies in the dtype."""
    assert expanding_bytes(untied, BF16) == 9216 * 0.625 + 2048 * (4 + 2 + 2 * 2)
    assert expanding_bytes(untied, torch.float32) == 9216 * 0.625 + 2048 * (4 + 2 + 2 * 4)


def test_a_rounded_drafts_workspace_is_its_largest_rounded_linears_and_none_without_one():
    """Hidden 64, MLP 128, 2 heads of 32 and one key/value head: q, o, gate, up and down take the
    CPU's int4 kernels (three workspaces among them), k and v (32 rows) do not; at hidden 24 none does."""
    cpu = torch.device("cpu")
    model = tiny_llama(hidden=64, mlp=128, heads=2, kv_heads=1)
    rounded = [m for m in layer_linears(model) if group_for(m, cpu)]
    each = {workspace_bytes(m.in_features, m.out_features, 64, BF16, group_for(m, cpu), "cpu", False) for m in rounded}
    assert len(rounded) == 5 and len(each) == 3
    assert rounded_workspace(model, BF16, 64, cpu) == max(each)
    assert rounded_workspace(tiny_llama(hidden=24, mlp=40, heads=3, kv_heads=3), BF16, 64, cpu) == 0
