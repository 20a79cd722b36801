"""A draft's grouped-query attention without copying its keys and values: the query heads of a
KV head packed as rows.

transformers' SDPA path, given a mask (a tree step always has one), repeats each KV head's keys
and values for its query heads (`repeat_kv`: a copy) before the attention. A captured draft step
attends over a span of its cache up to the whole reserved capacity (decoding/static_step.py), so
for Llama-3.1-8B (8 KV heads for 32 query heads, 128 dimensions) over the default capacity of
~6400 slots that is 2 x 6400 x 32 x 128 x 2 bytes = 105 MB written a layer, 3.4 GB a step: about
what its 32 layers' 4-bit weights take to read (~3.7 GB with their scales; arithmetic on its
config), and a third of that over a span of 2048. Attention is per
query row, so the `groups` query heads of a KV head can instead be its rows: q [B, H, n, d] viewed
as [B, H / groups, groups n, d] against the KV heads as they are, the mask's n rows repeated for
each group (groups n S mask entries, where the copies were 2 groups S d a head), the output viewed
back. transformers does this for a single query row (`pack_gqa`); here every width. Only drafts
use it: each attention module's config is copied with this implementation's name, so a model
sharing its config (a target) keeps transformers' own.
"""

import copy

import torch
from torch import nn
from transformers import AttentionInterface

from specchat.bounded_attention import NAME as BOUNDED
from specchat.bounded_attention import bounded_sdpa, fused_serves, in_calls, leading_rows, rows_per_call

NAME = "specchat_grouped_sdpa"


def grouped_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: [B, n, H, d] from q [B, H, n, d] and k, v [B, H / groups, S, d];
    a mask shared by every head ([B, 1, n, S]) packs the groups as rows, its rows in calls bounded as
    bounded_attention.py bounds them; anything else goes to bounded_sdpa."""
    groups = module.num_key_value_groups
    if attention_mask is None or attention_mask.shape[1] != 1 or groups == 1:
        return bounded_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    def attend(rows_query: torch.Tensor, rows_mask: torch.Tensor) -> torch.Tensor:
        batch, heads, rows, dim = rows_query.shape
        packed = rows_query.reshape(batch, heads // groups, groups * rows, dim)  # rows: group-major, as the heads
        mask = rows_mask.repeat(1, 1, groups, 1)
        out = nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout,
                                                         scale=scaling)
        return out.reshape(batch, heads, rows, dim).transpose(1, 2)

    rows = rows_per_call(query.shape[1], key.shape[2])
    if query.is_cuda and rows < query.shape[2]:  # the first call's packed inputs, built where they are asked about
        first = query[:, :, :rows]
        packed = first.reshape(first.shape[0], first.shape[1] // groups, -1, first.shape[3])
        if fused_serves(packed, key, value, leading_rows(attention_mask, rows).repeat(1, 1, groups, 1)):
            rows = query.shape[2]
    return in_calls(query, attention_mask, rows, attend).contiguous(), None


AttentionInterface.register(NAME, grouped_sdpa)


def pack_grouped_attention(module: nn.Module) -> int:
    """Give every grouped-query attention inside `module` (groups > 1, on SDPA, bounded or not) its
    own config that names grouped_sdpa; how many."""
    found = [child for child in module.modules() if getattr(child, "num_key_value_groups", 1) > 1
             and getattr(getattr(child, "config", None), "_attn_implementation", None) in ("sdpa", BOUNDED)]
    for attention in found:
        attention.config = copy.copy(attention.config)
        attention.config._attn_implementation = NAME
    return len(found)
