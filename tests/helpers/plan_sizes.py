"""The paper's pairs' and the embedded pair's sizes as their configs' arithmetic, written out
(never the plan's own output), and plans made from the shipped configs on virtual machines."""

from pathlib import Path

import torch

from specchat.bounded_attention import ATTENTION_BYTES, LEAST_ROWS, MATH_BYTES_PER_SCORE
from specchat.offload.direct_io import ALIGN
from specchat.plan.machine import RUNTIME_BYTES, Machine
from specchat.plan.pair import plan_pair
from specchat.plan.request import Pair, PlanRequest

GB = 10**9
NOWHERE = Path("/nonexistent")  # no layer file is read or written: only its size is weighed
TREE = 2049  # the largest tree a GPU's --budget auto builds offloaded (2048), plus its root
BF16 = 2
FP32 = 4  # rotary frequencies stay float32 buffers whatever the weights' dtype


def int4_linear(inputs: int, outputs: int, group: int, act_order: bool) -> int:
    """A GPTQ linear as the int4 kernel holds it (quant/int4.py): nibbles [O, I/2], a bf16 scale and
    zero per kernel group (GPTQ's group, or 256 for one group over all inputs) and output, and with
    act-order the input permutation (int64)."""
    kernel_group = 256 if group == -1 else group
    return inputs * outputs // 2 + (inputs // kernel_group) * outputs * 2 * BF16 + (inputs * 8 if act_order else 0)


def llama_layer_linears(hidden: int, mlp: int, kv_heads: int, head_dim: int = 128) -> list[tuple[int, int]]:
    kv = kv_heads * head_dim
    return [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, mlp), (hidden, mlp), (mlp, hidden)]


def kv_per_token(layers: int, kv_heads: int, head_dim: int = 128) -> int:
    return layers * 2 * kv_heads * head_dim * BF16


ROTARY_BYTES = 2 * 64 * FP32  # a head_dim of 128: inv_freq and its original copy


def gpu_plan(target: str, draft: str | None, vram_gb: float, ram_gb: float, context: int | None = None,
             kinds: tuple[str, ...] = ("none", "nf4")):
    pair = Pair(target, torch.bfloat16, draft=draft, draft_kinds=kinds, context=context)
    return plan_pair(pair, PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE),
                     Machine(vram_gb=vram_gb, ram_gb=ram_gb))


# The embedded pair's configs: qwen2.5-coder-1.5b (28 layers of 1536, MLP 8960, 12 heads and 2 KV
# heads of 128) and qwen2.5-coder-0.5b (24 layers of 896, MLP 4864, 14 heads and 2 KV heads of 64),
# each with an untied LM head over 151936 tokens and q/k/v biases.
QWEN_VOCAB = 151936
TARGET_LINEARS = llama_layer_linears(1536, 8960, 2)  # q, k, v, o, gate, up, down
DRAFT_LINEARS = llama_layer_linears(896, 4864, 2, head_dim=64)
# the target in bf16: its embeddings, head and final norm; a layer's linears, q/k/v biases and two norms (93.6 MB)
TARGET_FIXED = 2 * QWEN_VOCAB * 1536 * BF16 + 1536 * BF16 + ROTARY_BYTES
TARGET_LAYER = (sum(i * o for i, o in TARGET_LINEARS) + (1536 + 2 * 256) + 2 * 1536) * BF16
TARGET_SLOT = -(-TARGET_LAYER // ALIGN) * ALIGN  # a ring slot: a layer, aligned for O_DIRECT
DRAFT_LINEAR_WEIGHTS = 24 * sum(i * o for i, o in DRAFT_LINEARS)
# The draft's layer while it turns int8 (models/layerwise.py): one layer's bf16 weights and the
# stacked copy of gate and up, that stack's int8 rows twice (quantized, then packed) and three
# float32 temporaries of 256 rows of the widest input (down's 4864).
DRAFT_STACK = 2 * 896 * 4864  # gate and up
DRAFT_PREPARING = (DRAFT_LINEAR_WEIGHTS // 24 + DRAFT_STACK) * BF16 + 2 * DRAFT_STACK + 3 * 256 * 4864 * FP32


def int8_draft(head_rows: int, dense_copies: bool = False) -> int:
    """The 0.5B draft as quant/int8.py holds it: every linear's weights int8 with a float32 scale
    per output row (and their bf16 copies beside with `dense_copies`), the embedding int8 with a
    scale per token and the head's `head_rows` rows likewise; the q/k/v biases, two norms a layer
    and the final norm in bf16, the rotary frequencies (head_dim 64) in float32."""
    scales = 24 * sum(outputs for _, outputs in DRAFT_LINEARS) * FP32
    copies = DRAFT_LINEAR_WEIGHTS * BF16 if dense_copies else 0
    tables = (QWEN_VOCAB + head_rows) * (896 + FP32)
    other = (24 * (896 + 2 * 128) + 24 * 2 * 896 + 896) * BF16 + 2 * 32 * FP32
    return DRAFT_LINEAR_WEIGHTS + scales + copies + tables + other


def item(memory, prefix: str) -> int:
    (found,) = [i.nbytes for i in memory.items if i.what.startswith(prefix)]
    return found


def assert_fits(memory, vram_gb: float, ram_gb: float) -> None:
    assert memory.total("device") <= vram_gb * GB
    assert memory.total("host") <= ram_gb * GB - RUNTIME_BYTES


def math_pass(heads: int, kv_heads: int, head_dim: int, hidden: int, mlp: int, context: int, tree: int,
              size: int = BF16) -> int:
    """A pass over `tree` tokens after `context`: its attention's (a math path: the keys and values
    of its KV heads widened to float32, and a call's scores, heads x rows x keys at 10 bytes each,
    its rows as many as 256 MiB hold, 16 at least; grouped heads packed: the call's mask repeated
    for each KV head's query heads and widened, its rows bounded by that too, or on a fused kernel
    the repeated mask and its aligned copy, whichever holds more), the mask (additive, boolean and
    a fused kernel's aligned copy), the MLP's three products and four hidden states."""
    keys, groups = context + tree, max(1, heads // kv_heads)
    widened = 2 * kv_heads * keys * head_dim * 4 if size < 4 else 0
    score_rows = max(LEAST_ROWS, ATTENTION_BYTES // (heads * keys * MATH_BYTES_PER_SCORE))
    if groups == 1:
        attention = widened + min(tree, score_rows) * heads * keys * MATH_BYTES_PER_SCORE
    else:
        mask_rows = min(tree, max(LEAST_ROWS, ATTENTION_BYTES // (groups * keys * (size + 4))))
        rows = min(mask_rows, score_rows)
        math = widened + rows * heads * keys * MATH_BYTES_PER_SCORE + rows * groups * keys * (size + 4)
        attention = max(math, mask_rows * groups * keys * 2 * size)
    return attention + tree * keys * (2 * size + 1) + 3 * tree * mlp * size + 4 * tree * hidden * size


def pair_on_a_cpu(context: int, tree: int, draft: int, layers: int) -> int:
    """The device bytes of the embedded pair's plan on a CPU, its target sized from the config
    (dense bf16: no kernels' workspace), its int8 draft's weights `draft` bytes: the target's fixed
    parts and `layers` bytes of its decoder layers (resident ones and the ring's slots), both KV
    caches over the context and the tree, the draft's layer while it turns int8, and the largest
    pass: the target's, or the draft's where its 14 heads' scores outweigh the target's wider MLP
    (a 256-token tree at 4096: 3.6 MB more)."""
    caches = (kv_per_token(28, 2) + kv_per_token(24, 2, head_dim=64)) * (context + tree)
    passes = math_pass(12, 2, 128, 1536, 8960, context, tree), math_pass(14, 2, 64, 896, 4864, context, tree)
    return TARGET_FIXED + layers + caches + draft + DRAFT_PREPARING + max(passes)
