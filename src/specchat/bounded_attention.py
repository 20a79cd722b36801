"""Every model's attention, given as it is built or loaded: a grouped-query attention's query
heads packed as rows of their KV head, no keys and values copied for them; and where no fused
kernel takes a pass, its query rows in SDPA calls whose memory is bounded (ATTENTION_BYTES).

Packing. transformers' SDPA path, given a mask (a tree pass always has one), copies each KV head's
keys and values for its query heads (`repeat_kv`) before the attention: for a 70B target (8 KV
heads for 64 query heads, 128 dimensions) over 4096 + 2049 slots that is 2 x 6145 x 64 x 128 x 2
bytes = 0.2 GB a layer, for the Llama-3.1-8B draft over a captured step's 6400 slots 105 MB a
layer. Attention is per query row, so the `groups` query heads of a KV head can instead be its
rows: q [B, H, n, d] viewed as [B, H / groups, groups n, d] against the KV heads as they are, the
mask's rows repeated for each group (groups n S entries, where the copies were 2 groups S d a
head), the output viewed back. transformers does this for a single query row (`pack_gqa`); here
every width. On the AMD EPYC (bf16, 2 threads, 2026-11-29) the embedded target's attention (12
query heads on 2) took 0.77-0.90x the copied path's time at 16-256 rows, its outputs bit for bit
the same (scripts/bench_attention.py).

Bounded calls. SDPA's fused kernels (flash, memory-efficient, cuDNN; a CPU's flash kernel) hold
no scores. Its math path computes in float32: it holds the keys and values widened to float32 and
about MATH_BYTES_PER_SCORE a score, the float32 scores, their float32 softmax and that cast back to
the compute dtype (one bfloat16 call of 16 heads x 1024 rows x 8192 keys grew 1.29 GB: 9.6 bytes a
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

A packed call repeats its rows' mask for the query heads of a KV head, and a fused kernel aligns
a copy of it, so its rows are bounded by that too (`mask_rows_per_call`). An attention without
grouped heads (Llama-2-7B's) whose pass is small enough for one bounded call is transformers' own
SDPA path, untouched. The plan counts what a call holds at most (`attention_bytes`, read by
plan/demand.py).
"""

import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from specchat.cuda_graph import shapes_repeat

NAME = "specchat_bounded_sdpa"  # attentions without grouped heads
GROUPED = "specchat_grouped_sdpa"  # grouped-query attentions, packed
ATTENTION_BYTES = 256 * 2**20  # what one call of a math-path SDPA may hold
MATH_BYTES_PER_SCORE = 10  # measured 8.8 in bfloat16, the scores alone: see above
FLOAT32 = 4
SDPA_FLAGS = threading.Lock()  # held by an SDPA call on CUDA while its backends' flags are set (cuda_kernels)
LEAST_ROWS = 16  # calls of fewer rows are slow and, at one row, round otherwise
ALL_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                SDPBackend.MATH)

Attend = Callable[[Tensor, Tensor], Tensor]  # (query rows [B, H, r, d], their mask rows) -> [B, r, H, d]


def rows_per_call(heads: int, keys: int) -> int:
    """Query rows whose math-path scores, heads x rows x keys, fit ATTENTION_BYTES."""
    return max(LEAST_ROWS, ATTENTION_BYTES // (heads * keys * MATH_BYTES_PER_SCORE))


def mask_rows_per_call(groups: int, keys: int, itemsize: int) -> int:
    """Query rows of a packed call whose mask, repeated for `groups` query heads, fits ATTENTION_BYTES
    with its float32 or aligned copy (`itemsize` + 4 bytes an entry: a math path widens it, a fused
    kernel aligns a copy)."""
    return max(LEAST_ROWS, ATTENTION_BYTES // (groups * keys * (itemsize + FLOAT32)))


def attention_bytes(heads: int, kv_heads: int, head_dim: int, rows: int, keys: int, itemsize: int) -> int:
    """What a layer's attention over `rows` queries and `keys` keys holds at most, on whichever path
    serves it: a math-path call's float32 copies of the keys and values (it computes in float32),
    its scores and, packed, its mask repeated for the query heads of a KV head and widened; or a
    fused packed call's repeated mask and the copy the kernel aligns."""
    widened = 2 * kv_heads * keys * head_dim * FLOAT32 if itemsize < FLOAT32 else 0
    groups = max(1, heads // kv_heads)  # (a config with more KV heads than query heads has none to group)
    if groups == 1:
        return widened + min(rows, rows_per_call(heads, keys)) * heads * keys * MATH_BYTES_PER_SCORE
    masked = min(rows, mask_rows_per_call(groups, keys, itemsize))
    math_rows = min(masked, rows_per_call(heads, keys))
    math = widened + math_rows * keys * (heads * MATH_BYTES_PER_SCORE + groups * (itemsize + FLOAT32))
    return max(math, masked * groups * keys * 2 * itemsize)


def backends_for(query: Tensor) -> list[SDPBackend]:
    """The SDPA kernels a call may run. cuDNN's builds an execution plan for each new shape, once,
    on the host: 39-57 ms a pass of the paper's 70B target on an H200 (torch 2.11, 2026-11-30), whose
    keys grow every iteration, so that each pass built one. Where shapes repeat (cuda_graph's
    repeating_shapes: a static draft step's, captured or not, and every capture's warm-ups and
    capture) its plan is built once a shape and cuDNN stays among SDPA's choices; everywhere else on
    CUDA SDPA chooses among the kernels that build none: flash, memory-efficient (which takes a
    tree's mask), the math path. A capture's warm-ups and the capture are one scope: a capture must
    not meet a kernel its warm-ups did not plan (cuDNN's plan cannot be built inside a capture), and
    a static step captured or not runs the same kernels (it grows the same trees)."""
    if query.is_cuda and not shapes_repeat():
        return [backend for backend in ALL_BACKENDS if backend != SDPBackend.CUDNN_ATTENTION]
    return list(ALL_BACKENDS)


def kernels_for(query: Tensor) -> AbstractContextManager:
    """The scope an SDPA call over `query` runs in: on CUDA, SDPA among `backends_for(query)`; on a
    CPU, as it is (cuDNN is CUDA's alone, and sdpa_kernel's flags cost ~24 us a call to set and
    restore: 0.7 ms of a 28-layer token)."""
    return cuda_kernels(backends_for(query)) if query.is_cuda else nullcontext()


@contextmanager
def cuda_kernels(backends: list[SDPBackend]) -> Iterator[None]:
    """SDPA among `backends`, one call at a time: sdpa_kernel sets flags global to the process, and
    DSI's target threads attend while the drafter captures its steps, so that without the lock a
    capture's warm-up could run under a target's flags (no cuDNN) and the capture under its own,
    building cuDNN's plan inside the capture. The lock is held while the call is launched, not run."""
    with SDPA_FLAGS, sdpa_kernel(backends):
        yield


def attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float,
              scaling: float | None) -> Tensor:
    """SDPA within `kernels_for(query)`."""
    with kernels_for(query):
        return nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                          scale=scaling)


def fused_serves(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> bool:
    """Whether SDPA runs these inputs in a fused kernel, which holds no scores; asked only on CUDA."""
    return query.is_cuda and fused_kernel_takes(query, key, value, mask, backends_for(query))


def fused_kernel_takes(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
                       backends: Sequence[SDPBackend] = ALL_BACKENDS) -> bool:
    """torch.backends.cuda's public checks of the fused kernels among `backends` over these inputs,
    as SDPA is called here (no dropout, not causal, heads already matched); a CPU's inputs pass none."""
    params = torch.backends.cuda.SDPAParams(query, key, value, mask, 0.0, False, False)
    checks = {SDPBackend.FLASH_ATTENTION: torch.backends.cuda.can_use_flash_attention,
              SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.can_use_efficient_attention,
              SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.can_use_cudnn_attention}
    return any(check(params) for backend, check in checks.items() if backend in backends)


def leading_rows(mask: Tensor, rows: int) -> Tensor:
    """The mask of the first `rows` query rows (a mask broadcast over the rows: its one row)."""
    return mask[..., :rows, :]


def packed_mask(mask: Tensor, rows: int, groups: int) -> Tensor:
    """The mask of `rows` query rows for their packed rows: its rows (a mask broadcast over them
    made one a row) repeated for each of the `groups` query heads of a KV head."""
    return mask.expand(-1, -1, rows, -1).repeat(1, 1, groups, 1)


def in_calls(query: Tensor, mask: Tensor, rows: int, attend: Attend) -> Tensor:
    """`attend` over `query`'s rows in as few calls of at most `rows` as hold them all, the calls
    evened out (rows // 2 each at least: never a call of one row), the outputs joined: [B, n, H, d]."""
    calls = -(-query.shape[2] // rows)
    if calls == 1:
        return attend(query, mask)
    masks = mask.expand(-1, -1, query.shape[2], -1).tensor_split(calls, dim=-2)  # a broadcast row: a view a row
    return torch.cat([attend(part, part_mask) for part, part_mask in zip(query.tensor_split(calls, dim=2), masks)],
                     dim=1)


def bounded_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention interface: [B, n, H, d] from q [B, H, n, d] and k, v [B, Hkv, S, d]."""
    heads, total, keys = query.shape[1], query.shape[2], key.shape[2]
    rows = rows_per_call(heads, keys)
    if attention_mask is None or total <= rows or kwargs.get("position_bias") is not None:
        with kernels_for(query):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                          **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)

    def attend(rows_query: Tensor, rows_mask: Tensor) -> Tensor:
        return attention(rows_query, key, value, rows_mask, dropout, scaling).transpose(1, 2)

    if fused_serves(query[:, :, :rows], key, value, leading_rows(attention_mask, rows)):
        rows = total
    return in_calls(query, attention_mask, rows, attend).contiguous(), None


def grouped_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention interface: [B, n, H, d] from q [B, H, n, d] and k, v [B, H / groups, S, d];
    a mask shared by every head ([B, 1, n, S]) packs the groups as rows, in bounded calls; anything
    else goes to bounded_sdpa (a mask a head: its keys and values copied)."""
    groups = module.num_key_value_groups
    if attention_mask is None or attention_mask.shape[1] != 1 or groups == 1:
        return bounded_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    def attend(rows_query: Tensor, rows_mask: Tensor) -> Tensor:
        batch, heads, rows, dim = rows_query.shape
        packed = rows_query.reshape(batch, heads // groups, groups * rows, dim)  # rows: group-major, as the heads
        out = attention(packed, key, value, packed_mask(rows_mask, rows, groups), dropout, scaling)
        return out.reshape(batch, heads, rows, dim).transpose(1, 2)

    masked = mask_rows_per_call(groups, key.shape[2], attention_mask.element_size())
    rows = min(rows_per_call(query.shape[1], key.shape[2]), masked)
    if query.is_cuda and rows < query.shape[2]:  # the first call's packed inputs, built where they are asked about
        first = query[:, :, :rows]
        packed = first.reshape(first.shape[0], first.shape[1] // groups, -1, first.shape[3])
        if fused_serves(packed, key, value, packed_mask(leading_rows(attention_mask, rows), rows, groups)):
            rows = masked
    return in_calls(query, attention_mask, rows, attend).contiguous(), None


AttentionInterface.register(NAME, bounded_sdpa)
AttentionInterface.register(GROUPED, grouped_sdpa)


def bound_attention(module: nn.Module) -> int:
    """Give every attention inside `module` still on transformers' SDPA its own config that names
    grouped_sdpa (grouped query heads) or bounded_sdpa (a model sharing that config keeps its own);
    how many."""
    found = [child for child in module.modules()
             if getattr(getattr(child, "config", None), "_attn_implementation", None) == "sdpa"
             and hasattr(child, "num_key_value_groups")]
    for attention in found:
        attention.config = copy.copy(attention.config)
        attention.config._attn_implementation = GROUPED if attention.num_key_value_groups > 1 else NAME
    return len(found)
