"""A wide pass's attention with what it holds bounded: where no fused kernel takes the inputs, the
query rows go to SDPA in calls whose scores fit ATTENTION_BYTES.

SDPA's fused kernels (flash, memory-efficient, cuDNN; a CPU's flash kernel) hold no scores. Its
math path computes in float32: it holds the keys and values widened to float32 and about
MATH_BYTES_PER_SCORE a score, the float32 scores, their float32 softmax and that cast back to the
compute dtype (one bfloat16 call of 16 heads x 1024 rows x 8192 keys grew 1.29 GB: 9.6 bytes a
score with the widened keys, values and mask, 8.8 without; scripts/attention_memory.py, torch 2.13
on the AMD EPYC, 2026-11-29). A tree pass of a 70B target (64 heads) over 2049 tokens after 8192
cached would hold 64 x 2049 x 10241 x 10 = 13.4 GB of scores at once; in calls of `rows_per_call`
rows, 256 MiB at most.

Rows attend independently, so the calls give each row what one call gives, up to a kernel's
blocking, which follows its rows (float32: bit for bit for contiguous heads of 128 dimensions from
7 rows a call, one rounding through a tiny model's strided queries; a call of one row takes another
kernel, so the calls are evened out: LEAST_ROWS // 2 rows each at least). On CUDA the inputs of
the first call, as it would run, are asked whether a fused kernel takes them (torch.backends.cuda's
public checks); if one does, all rows go in one call. A CPU's flash kernel cannot be asked so:
there, and wherever the answer is no, the calls are bounded.

A pass small enough for one bounded call (every pass of the embedded pair at its default
context) is transformers' own SDPA path, untouched. Past that the keys and values are copied for
the query heads once a layer (`repeat_kv`, as transformers does when a mask is given) and the
calls share them. The plan counts the copies, a call's float32 copies of them and its scores
(`attention_bytes`, read by plan/demand.py).
"""

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

NAME = "specchat_bounded_sdpa"
ATTENTION_BYTES = 256 * 2**20  # what one call of a math-path SDPA may hold
MATH_BYTES_PER_SCORE = 10  # measured 8.8 in bfloat16, the scores alone: see above
FLOAT32 = 4
LEAST_ROWS = 16  # calls of fewer rows are slow and, at one row, round otherwise

Attend = Callable[[Tensor, Tensor], Tensor]  # (query rows [B, H, r, d], their mask rows) -> [B, r, H, d]


def rows_per_call(heads: int, keys: int) -> int:
    """Query rows whose math-path scores, heads x rows x keys, fit ATTENTION_BYTES."""
    return max(LEAST_ROWS, ATTENTION_BYTES // (heads * keys * MATH_BYTES_PER_SCORE))


def attention_bytes(heads: int, kv_heads: int, head_dim: int, rows: int, keys: int, itemsize: int) -> int:
    """What a layer's attention over `rows` queries and `keys` keys holds at most: the copies of
    keys and values for the query heads (grouped-query models), a math-path call's float32 copies
    of them (it computes in float32) and its scores."""
    copies = 2 * heads * keys * head_dim * itemsize if kv_heads < heads else 0
    widened = 2 * heads * keys * head_dim * FLOAT32 if itemsize < FLOAT32 else 0
    return copies + widened + min(rows, rows_per_call(heads, keys)) * heads * keys * MATH_BYTES_PER_SCORE


def fused_serves(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> bool:
    """Whether SDPA runs these inputs in a fused kernel, which holds no scores; asked only on CUDA."""
    return query.is_cuda and fused_kernel_takes(query, key, value, mask)


def fused_kernel_takes(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> bool:
    """torch.backends.cuda's public checks over these inputs, as SDPA is called here (no dropout,
    not causal, heads already matched); a CPU's inputs pass none of them."""
    params = torch.backends.cuda.SDPAParams(query, key, value, mask, 0.0, False, False)
    checks = (torch.backends.cuda.can_use_flash_attention, torch.backends.cuda.can_use_efficient_attention,
              torch.backends.cuda.can_use_cudnn_attention)
    return any(check(params) for check in checks)


def leading_rows(mask: Tensor, rows: int) -> Tensor:
    """The mask of the first `rows` query rows; a mask broadcast over the rows as it is."""
    return mask if mask.shape[-2] == 1 else mask[..., :rows, :]


def in_calls(query: Tensor, mask: Tensor, rows: int, attend: Attend) -> Tensor:
    """`attend` over `query`'s rows in as few calls of at most `rows` as hold them all, the calls
    evened out (rows // 2 each at least: never a call of one row), the outputs joined: [B, n, H, d]."""
    calls = -(-query.shape[2] // rows)
    if calls == 1:
        return attend(query, mask)
    masks = [mask] * calls if mask.shape[-2] == 1 else mask.tensor_split(calls, dim=-2)
    return torch.cat([attend(part, part_mask) for part, part_mask in zip(query.tensor_split(calls, dim=2), masks)],
                     dim=1)


def bounded_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention interface: [B, n, H, d] from q [B, H, n, d] and k, v [B, Hkv, S, d]."""
    heads, total, keys = query.shape[1], query.shape[2], key.shape[2]
    rows = rows_per_call(heads, keys)
    if attention_mask is None or total <= rows or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)

    def attend(rows_query: Tensor, rows_mask: Tensor) -> Tensor:
        out = nn.functional.scaled_dot_product_attention(rows_query, key, value, attn_mask=rows_mask,
                                                         dropout_p=dropout, scale=scaling)
        return out.transpose(1, 2)

    if fused_serves(query[:, :, :rows], key, value, leading_rows(attention_mask, rows)):
        rows = total
    return in_calls(query, attention_mask, rows, attend).contiguous(), None


AttentionInterface.register(NAME, bounded_sdpa)


def bound_attention(module: nn.Module) -> int:
    """Give every attention inside `module` still on transformers' SDPA its own config that names
    bounded_sdpa (a model sharing that config keeps its own); how many."""
    found = [child for child in module.modules()
             if getattr(getattr(child, "config", None), "_attn_implementation", None) == "sdpa"
             and hasattr(child, "num_key_value_groups")]
    for attention in found:
        attention.config = copy.copy(attention.config)
        attention.config._attn_implementation = NAME
    return len(found)
