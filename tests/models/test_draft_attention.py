"""A draft's attention with its queries and keys rotated together (models/draft_attention.py): the
rotation is transformers', every attention class it takes computes what it computed, its queries
reach the attention laid out as it reads them, and it takes only attentions whose q/k/v are one
product, in that order, and whose heads turn whole."""

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig,
                          MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specchat.bounded_attention import bound_attention
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.draft_attention import LLAMA_ATTENTIONS, DraftAttention, replace_attention, rotate, stacked_qkv
from specchat.quant.stacked import stack_projections

SIZES = dict(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {"LlamaAttention": (LlamaConfig, LlamaForCausalLM), "Qwen2Attention": (Qwen2Config, Qwen2ForCausalLM),
            "MistralAttention": (MistralConfig, MistralForCausalLM),
            "MixtralAttention": (MixtralConfig, MixtralForCausalLM)}


def built(family: tuple[type, type], **overrides: object) -> CausalLM:
    config_class, model_class = family
    torch.manual_seed(0)
    config = config_class(**(SIZES | overrides))
    config._attn_implementation = "sdpa"
    return CausalLM(model_class(config).eval())


def tree_step(lm: CausalLM) -> torch.Tensor:
    """Six rows after a 7-token prompt, two of them siblings (each sees the prefix, not the other)."""
    tokens = torch.arange(13) * 7 % 50
    cache = new_cache()
    lm.hidden(tokens[:7], torch.arange(7), cache)
    mask = torch.ones(6, 13, dtype=torch.bool).tril(diagonal=7)
    mask[4, 10] = False
    return lm.hidden(tokens[7:], torch.tensor([7, 8, 9, 10, 10, 11]), cache, mask)


@pytest.mark.parametrize("heads_first", [True, False], ids=["heads-first", "rows-first"])
def test_rotating_queries_and_keys_together_is_transformers_rotation(heads_first):
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 5, 4, 16, generator=generator), torch.randn(1, 5, 2, 16, generator=generator)
    angles = torch.rand(1, 5, 8, generator=generator) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # a head's halves alike
    rotated = rotate(torch.cat([query, key], 2), cos, sin, heads_first)
    expected = apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
    assert rotated.shape == (1, 6, 5, 16) and rotated.is_contiguous() == heads_first
    # float32, values up to ~4: at most 2.4e-7 apart (one rounding step) on the AMD EPYC (2026-11-29),
    # addcmul rounding a product and its sum once where transformers rounds twice
    torch.testing.assert_close(rotated[:, :4], expected[0], rtol=0, atol=4.8e-7)
    torch.testing.assert_close(rotated[:, 4:], expected[1], rtol=0, atol=4.8e-7)


@pytest.mark.parametrize("packed", [False, True], ids=["sdpa", "grouped-sdpa"])
@pytest.mark.parametrize("name", sorted(LLAMA_ATTENTIONS))
def test_every_attention_it_takes_computes_what_transformers_computed(name, packed):
    lm = built(FAMILIES[name])
    before = tree_step(lm)
    for layer in lm.model.model.layers:
        assert stack_projections(layer) >= 1 and replace_attention(layer) == 1
        assert not packed or bound_attention(layer) == 1
    assert all(isinstance(layer.self_attn, DraftAttention) for layer in lm.model.model.layers)
    after = tree_step(lm)
    # float32, states up to ~3.2: at most 4.8e-7 apart on the AMD EPYC (2026-11-29), all of it the
    # rotation's (q/k/v stacked alone: 0 apart)
    torch.testing.assert_close(after, before, rtol=0, atol=9.6e-7)


def test_it_takes_only_attentions_stacked_and_turning_whole_heads_of_llamas_kind():
    unstacked = built(FAMILIES["LlamaAttention"])
    assert replace_attention(unstacked.model) == 0
    partial = built(FAMILIES["LlamaAttention"], rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                  "partial_rotary_factor": 0.5})
    stack_projections(partial.model)
    assert replace_attention(partial.model) == 0
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(Qwen3Config(**SIZES, head_dim=16)).eval()  # q and k normalized per head
    stack_projections(qwen3)
    assert replace_attention(qwen3) == 0


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["one-key-a-query", "grouped"])
def test_queries_reach_the_attention_laid_out_as_it_reads_them(monkeypatch, kv_heads):
    """Grouped: heads outer ([H, n, d] in memory), whose heads bounded_attention packs as rows;
    else rows outer ([n, H, d]), the layout SDPA gives its output in on CUDA."""
    layouts = []

    def recording(module, query, *args, **kwargs):
        layouts.append("heads outer" if query.stride(1) > query.stride(2) else "rows outer")
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "recording", recording)
    lm = built(FAMILIES["LlamaAttention"], num_key_value_heads=kv_heads)
    lm.model.config._attn_implementation = "recording"
    for layer in lm.model.model.layers:
        stack_projections(layer)
        replace_attention(layer)
    tree_step(lm)
    assert layouts == ["heads outer" if kv_heads == 2 else "rows outer"] * 4  # two layers, prompt and tree


def test_q_k_and_v_are_taken_only_as_one_products_parts_in_that_order():
    lm = built(FAMILIES["LlamaAttention"])
    first, second = (layer.self_attn for layer in lm.model.model.layers)
    for layer in lm.model.model.layers:
        stack_projections(layer)
    first.q_proj, first.k_proj = first.k_proj, first.q_proj  # one product's parts, out of order
    second.q_proj = first.k_proj  # in order, from two products
    assert stacked_qkv(first) is None and stacked_qkv(second) is None
    assert sum(replace_attention(layer) for layer in lm.model.model.layers) == 0
