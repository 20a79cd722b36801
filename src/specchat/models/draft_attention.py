"""A draft's attention whose rotary embedding is four kernels for its queries and keys together.

transformers' Llama attention rotates queries and keys apart: q cos + rotate_half(q) sin, where
rotate_half(x) = cat(-x2, x1) over the halves of a head, is five kernels for each (two products,
the negation, the concatenation, the sum): ten of the 23 a CUDA-prepared Llama-2-7B draft layer
dispatches (scripts/count_draft_ops.py), each a few microseconds on an H200 however few its rows.
With q/k/v stacked into one product (quant/stacked.py) the queries and keys of a row lie side by
side, [n, H + Hkv, d], and cos and sin are shared by every head, so the same rotation over them
at once is four kernels: the negation and concatenation of rotate_half, qk cos, and one addcmul,
qk cos + rotate_half(qk) sin, written straight where the attention reads it: in grouped attention
as [H + Hkv, n, d], so that bounded_attention.py packs the query heads as rows without a copy,
else as [n, H + Hkv, d], the layout SDPA returns its output in on CUDA (its flash and
memory-efficient kernels), so that the output needs no copy either. Only drafts on CUDA use it:
rounding once where transformers rounds twice (the addcmul) changes a draft's probabilities only
in its last bits, and SpecExec's verifier never reads them.
"""

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward, rotate_half

from specchat.quant.stacked import Part

# transformers' attentions whose forward is LlamaAttention's but for the sliding window they pass
# (tests/models/test_draft_attention.py runs each against its own); Qwen3's normalizes q and k
LLAMA_ATTENTIONS = frozenset({"LlamaAttention", "Qwen2Attention", "MistralAttention", "MixtralAttention"})


class DraftAttention(nn.Module):
    """An attention of LLAMA_ATTENTIONS over its stacked q/k/v product (the Stack's linear)."""

    def __init__(self, attention: nn.Module, qkv: nn.Module) -> None:
        super().__init__()
        self.config = attention.config
        self.layer_idx = attention.layer_idx
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        self.num_key_value_groups = attention.num_key_value_groups
        self.heads = attention.config.num_attention_heads
        self.rotated_heads = self.heads + self.heads // self.num_key_value_groups  # queries', then keys'
        self.is_causal = True
        self.sliding_window = getattr(attention, "sliding_window", getattr(attention.config, "sliding_window", None))
        self.qkv = qkv
        self.o_proj = attention.o_proj

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, cache: Cache | None = None, **kwargs
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = hidden_states.shape[:-1]
        qkv = self.qkv(hidden_states).unflatten(-1, (-1, self.head_dim))  # [B, n, H + 2 Hkv, d]
        rotated = rotate(qkv[..., :self.rotated_heads, :], *position_embeddings, self.num_key_value_groups > 1)
        query, key = rotated[:, :self.heads], rotated[:, self.heads:]
        value = qkv[..., self.rotated_heads:, :].transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = attend(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling,
                              sliding_window=self.sliding_window, **kwargs)
        return self.o_proj(out.reshape(*rows, -1).contiguous()), weights


def rotate(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads_first: bool) -> torch.Tensor:
    """[B, h, n, d]: heads [B, n, h, d] x cos + rotate_half(x) sin, cos and sin [B, n, d] shared by
    the heads; laid out as [B, h, n, d] where `heads_first`, else as [B, n, h, d]."""
    batch, rows, count, dim = heads.shape
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    if heads_first:
        out = heads.new_empty(batch, count, rows, dim).transpose(1, 2)
    else:
        out = heads.new_empty(batch, rows, count, dim)
    torch.addcmul(heads * cos, rotate_half(heads), sin, out=out)
    return out.transpose(1, 2)


def stacked_qkv(attention: nn.Module) -> nn.Module | None:
    """The one product an attention's q, k and v projections are parts of, in that order; None
    where they are not (quant/stacked.py left them apart)."""
    parts = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    if not all(isinstance(part, Part) for part in parts):
        return None
    stack = parts[0].stack
    if any(part.stack is not stack or part.index != index for index, part in enumerate(parts)):
        return None
    return stack.linear


def replace_attention(layer: nn.Module) -> int:
    """Replace every attention of LLAMA_ATTENTIONS inside `layer` whose q/k/v are stacked, rotating
    whole heads (cos the width of a head), by a DraftAttention; how many."""
    found = [(parent, name, child) for parent in layer.modules() for name, child in parent.named_children()
             if type(child).__name__ in LLAMA_ATTENTIONS and stacked_qkv(child) is not None
             and whole_heads_rotate(child.config)]
    for parent, name, child in found:
        setattr(parent, name, DraftAttention(child, stacked_qkv(child)))
    return len(found)


def whole_heads_rotate(config: object) -> bool:
    """Whether the rotary embedding turns every dimension of a head (a partial one leaves some)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return parameters.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) == 1.0
