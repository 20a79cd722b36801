"""A draft's grouped-query attention with its query heads packed as rows (models/grouped_attention.py):
it computes what transformers' SDPA computes after copying the keys and values, it is given only
to the attention modules asked for, and a model that shares their config keeps transformers' own."""

import pytest
import torch
from helpers.attention import Attention, drawn
from helpers.tiny import build_tiny, perturbed
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specchat import bounded_attention
from specchat.decoding.kvcache import new_cache
from specchat.models import grouped_attention
from specchat.models.grouped_attention import NAME, grouped_sdpa, pack_grouped_attention


@pytest.mark.parametrize("additive", [True, False], ids=["float-mask", "bool-mask"])
@pytest.mark.parametrize("groups", [2, 4])
def test_packed_rows_give_what_copied_keys_and_values_give(groups, additive):
    query, key, value, attend = drawn(groups)
    mask = torch.zeros(attend.shape).masked_fill(~attend, float("-inf")) if additive else attend
    packed, _ = grouped_sdpa(Attention(groups), query, key, value, mask, scaling=0.25)
    copied, _ = sdpa_attention_forward(Attention(groups), query, key, value, mask, scaling=0.25)
    assert packed.shape == copied.shape == (1, 5, 2 * groups, 16)
    # float32, bit for bit on the AMD EPYC (2026-11-28): each row's sum runs over the same keys in order
    assert torch.equal(packed, copied)


def test_packed_rows_in_bounded_calls_give_what_one_call_gives(monkeypatch):
    query, key, value, attend = drawn(4, rows=40, keys=50)
    whole, _ = grouped_sdpa(Attention(4), query, key, value, attend)
    monkeypatch.setattr(grouped_attention, "rows_per_call", lambda heads, keys: 16)
    parts, _ = grouped_sdpa(Attention(4), query, key, value, attend)  # three calls of 14, 13 and 13 rows
    # float32: 0 apart for these drawn rows on the AMD EPYC (2026-11-29); one rounding at most
    torch.testing.assert_close(parts, whole, rtol=0, atol=5e-7)


def test_without_a_mask_shared_by_the_heads_it_is_transformers_sdpa():
    query, key, value, attend = drawn(2)
    per_head = torch.zeros(1, 4, 5, 12).masked_fill(~attend.expand(1, 4, 5, 12), float("-inf"))
    for mask in (None, per_head):
        assert torch.equal(grouped_sdpa(Attention(2), query, key, value, mask)[0],
                           sdpa_attention_forward(Attention(2), query, key, value, mask)[0])


def test_only_the_modules_asked_get_it_and_a_model_sharing_their_config_keeps_sdpa(monkeypatch):
    target = build_tiny(0, dtype=torch.float32)
    draft = perturbed(target, 0.1, seed=1)  # its modules share the target's config object
    tokens = torch.arange(9) % 50
    mask = torch.ones(4, 9, dtype=torch.bool).tril(diagonal=5)  # 4 rows after 5 cached, causal
    mask[3, 7] = False  # a sibling, as in a tree
    before = draft.hidden(tokens[5:], torch.arange(5, 9), prefilled(draft, tokens[:5]), mask)
    assert pack_grouped_attention(draft.model) == draft.model.config.num_hidden_layers
    assert pack_grouped_attention(draft.model) == 0  # none left on sdpa
    assert {layer.self_attn.config._attn_implementation for layer in draft.model.model.layers} == {NAME}
    assert target.model.config._attn_implementation == "sdpa" and draft.model.config is target.model.config
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in target.model.model.layers)
    cache = prefilled(draft, tokens[:5])  # no mask: transformers' SDPA, causal
    monkeypatch.setattr(bounded_attention, "sdpa_attention_forward", None)  # a tree's mask: the packed rows alone
    after = draft.hidden(tokens[5:], torch.arange(5, 9), cache, mask)
    assert torch.equal(after, before)  # float32, bit for bit here (the AMD EPYC, 2026-11-28), as above


def prefilled(lm, tokens: torch.Tensor):
    cache = new_cache()
    lm.hidden(tokens, torch.arange(tokens.numel()), cache)
    return cache
