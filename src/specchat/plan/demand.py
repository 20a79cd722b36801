"""What a model asks of memory besides its decoder layers, as arithmetic on its config: its KV
cache per token and the activations of its largest pass, and a draft's weights in each
quantization. Pure numbers: the plan (`plan/budget.py`) adds them up.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from specchat.bounded_attention import attention_bytes
from specchat.quant.fp8 import fp8_weight_bytes
from specchat.quant.int4 import workspace_bytes
from specchat.quant.int4_rtn import ROUND_ROWS, group_for
from specchat.quant.int8 import QUANT_ROWS

# bitsandbytes' nf4: 4 bits a weight plus one fp32 absmax per block of 64 (no double quantization).
NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64
INT8_SCALE_BYTES = 4  # quant/int8.py: one fp32 scale per output row
FP32, INT64 = 4, 8


@dataclass(frozen=True)
class ModelShape:
    """The sizes of one model that its caches and activations follow."""

    heads: int
    kv_heads: int  # grouped-query attention: fewer than `heads`
    head_dim: int
    hidden: int
    intermediate: int  # the MLP's width a token computes (a MoE block's: its routed experts' together, `mlp_width`)
    kv_per_token: int  # bytes of one cache slot: keys and values of every layer
    itemsize: int  # bytes of one activation element (the compute dtype)
    experts: int = 0  # a MoE block's E experts its router scores; 0: a dense MLP
    routed: int = 0  # the k experts a token routes to

    def kv_bytes(self, tokens: int) -> int:
        return self.kv_per_token * tokens

    def pass_bytes(self, context: int, tree: int) -> int:
        """Activations of one pass over `tree` tokens after `context` cached ones, one layer at a
        time: its attention's (the keys and values copied for the query heads, their float32 copies
        and one bounded call's math-path scores: bounded_attention.py), the tree mask (additive,
        boolean, and the copy a fused kernel aligns), the MLP's three n x intermediate products (a
        MoE block's n x k routed rows at once, as a grouped experts kernel holds them; the loop
        over experts holds one expert's rows at a time), a MoE router's, and a few n x hidden
        states. An upper bound: fused kernels hold less."""
        n, keys, size = tree, context + tree, self.itemsize
        attention = attention_bytes(self.heads, self.kv_heads, self.head_dim, n, keys, size)
        masks = n * keys * (2 * size + 1)
        mlp = 3 * n * self.intermediate * size
        hidden = 4 * n * self.hidden * size
        return attention + masks + mlp + self.router_bytes(n) + hidden

    def router_bytes(self, tokens: int) -> int:
        """A MoE router over `tokens` (transformers' TopKRouter): its n x E logits in the compute
        dtype, their float32 softmax, and the top-k weights (float32) and expert ids (int64)."""
        return tokens * self.experts * (self.itemsize + FP32) + tokens * self.routed * (FP32 + INT64)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """One cache slot: keys and values of every layer."""
    kv_heads, head_dim = attention_dims(config)
    return config.num_hidden_layers * 2 * kv_heads * head_dim * dtype.itemsize


def attention_dims(config) -> tuple[int, int]:
    """(key/value heads, dimensions a head)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return getattr(config, "num_key_value_heads", None) or heads, head_dim


def shape_of(config, dtype: torch.dtype) -> ModelShape:
    experts = getattr(config, "num_experts", None) or 0  # Mixtral's num_local_experts too (its attribute_map)
    routed = config.num_experts_per_tok if experts else 0
    return ModelShape(config.num_attention_heads, *attention_dims(config), config.hidden_size, mlp_width(config),
                      kv_bytes_per_token(config, dtype), dtype.itemsize, experts, routed)


def mlp_width(config) -> int:
    """The intermediate features a token computes in the widest MLP: a dense model's
    intermediate_size; in a MoE block, its k routed experts' at each one's size
    (moe_intermediate_size; Mixtral's intermediate_size is its experts') and a shared expert's
    (Qwen2-MoE's shared_expert_intermediate_size), and never less than intermediate_size, the
    width of the dense layers a MoE config may keep (Qwen's mlp_only_layers)."""
    experts = getattr(config, "num_experts", None)
    if not experts:
        return config.intermediate_size
    expert = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    routed = config.num_experts_per_tok * expert + (getattr(config, "shared_expert_intermediate_size", None) or 0)
    return max(routed, config.intermediate_size)


def draft_weight_bytes(model: PreTrainedModel, dtype: torch.dtype, quant: str, dense_kept: bool = False,
                       head_rows: int | None = None, kernel: torch.device = torch.device("cpu")) -> int:
    """Bytes of a draft's weights (`model` on the meta device) as `quant` and the sub-vocabulary
    head (models/draft_approx.py) store them:
    none: as loaded (floating tensors in `dtype`, packed ones as they are);
    int8 (quant/int8.py): the decoder's linears as int8 with a scale per row, and their dense
      copies beside when `dense_kept`; the input embedding as int8 rows with a scale each; with
      the whole vocabulary the LM head too (a tied head in a copy of its own);
    int4 (quant/int4_rtn.py): the decoder's linears that `kernel`'s int4 kernels take, packed (half
      a byte a weight) with a scale and a zero a group in `dtype`;
    nf4 (bitsandbytes): every linear but the LM head at NF4_BYTES_PER_WEIGHT;
    fp8 (quant/fp8.py): the decoder's linears at a byte a weight and a float32 scale a row.
    `head_rows`: a head restricted to that many tokens, a copy of that many rows (in int8 under
    int8); the whole head is let go unless it is the input embedding too; None: the whole
    vocabulary."""
    total = sum(tensor_bytes(t, dtype) for t in unique_tensors(model))
    head = model.get_output_embeddings()
    layers = [m for m in model.get_decoder().modules() if isinstance(m, nn.Linear)]
    if quant == "int8":
        total += sum(int8_bytes(m) - (0 if dense_kept else m.weight.numel() * dtype.itemsize) for m in layers)
        embedding = model.get_input_embeddings().weight
        total += int8_bytes(model.get_input_embeddings()) - embedding.numel() * dtype.itemsize
    elif quant == "int4":
        groups = [(m, group_for(m, kernel)) for m in layers]
        total -= sum(m.weight.numel() * dtype.itemsize - int4_bytes(m, group, dtype) for m, group in groups if group)
    elif quant == "fp8":
        total -= sum(m.weight.numel() * dtype.itemsize - fp8_weight_bytes(m) for m in layers)
    elif quant == "nf4":
        linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head]
        total -= sum(m.weight.numel() * dtype.itemsize - int(m.weight.numel() * NF4_BYTES_PER_WEIGHT) for m in linears)
    vocab, width = head.weight.shape
    tied = head.weight is model.get_input_embeddings().weight
    dense_head = 0 if tied else head.weight.numel() * dtype.itemsize
    if head_rows is not None and head_rows < vocab:
        rows = head_rows * (width + INT8_SCALE_BYTES) if quant == "int8" else head_rows * width * dtype.itemsize
        return total - dense_head + rows
    if quant == "int8":
        total += int8_bytes(head) - dense_head
    return total


def preparing_bytes(model: PreTrainedModel, dtype: torch.dtype) -> int:
    """Bytes a draft holds above its int8 weights while it loads (models/layerwise.py), an upper
    bound: one decoder layer's dense weights in `dtype` and the stacked copy of its largest stack
    (quant/stacked.py), bounded by its two largest linears together; that stack's int8 rows twice
    more (the quantized tensor fbgemm packs from, and its packed copy); and quantize_rows' float32
    temporaries, up to three of QUANT_ROWS rows of the widest input."""
    linears = layer_linears(model)
    sizes = sorted(m.weight.numel() for m in linears)
    widest = max(m.in_features for m in linears)
    return (sum(sizes) + sum(sizes[-2:])) * dtype.itemsize + 2 * sum(sizes[-2:]) + 3 * QUANT_ROWS * widest * 4


def layer_linears(model: PreTrainedModel) -> list[nn.Linear]:
    """The dense linears of a draft's first decoder layer: every layer's shapes."""
    return [m for m in model.get_decoder().layers[0].modules() if isinstance(m, nn.Linear)]


def int4_bytes(linear: nn.Linear, group_size: int, dtype: torch.dtype) -> int:
    """An Int4Linear's weight: its packed nibbles and its [G, O, 2] scales and zeros in `dtype`."""
    return linear.weight.numel() // 2 + 2 * linear.in_features // group_size * linear.out_features * dtype.itemsize


def rounding_bytes(model: PreTrainedModel, dtype: torch.dtype) -> int:
    """Bytes a draft holds above its int4 weights while it loads, an upper bound: one decoder
    layer's dense weights in `dtype`; the largest linear's canonical nibbles beside their packed
    copy; and `rounded`'s temporaries, three float32 blocks of ROUND_ROWS rows of the widest input."""
    linears = layer_linears(model)
    widest = max(m.in_features for m in linears)
    return (sum(m.weight.numel() for m in linears) * dtype.itemsize + max(m.weight.numel() for m in linears) // 2
            + 3 * ROUND_ROWS * widest * FP32)


def expanding_bytes(model: PreTrainedModel, dtype: torch.dtype) -> int:
    """Bytes a draft stored in 4 bits holds above its expanded weights while it loads (--draft-quant
    dense: quant/int4_dense.expand_linears), an upper bound: a decoder layer's packed weights
    (half a byte a weight and a scale and zero a group of 32: 0.625 bytes; each linear's go once it
    is expanded) and, a weight of its largest linear, the expansion's float32 value, its two
    nibble bytes and its cast into `dtype` (int4_chunks.chunk_buffers), and one more copy in
    `dtype` where an act-order weight's inputs are put back in order."""
    sizes = [m.weight.numel() for m in layer_linears(model)]
    return int(sum(sizes) * 0.625) + max(sizes) * (FP32 + 2 + 2 * dtype.itemsize)


def rounded_workspace(model: PreTrainedModel, dtype: torch.dtype, rows: int, kernel: torch.device) -> int:
    """The largest temporary a draft's rounded linears allocate over `rows` inputs (quant.int4's
    bound; linears run one at a time)."""
    groups = [(m, group_for(m, kernel)) for m in layer_linears(model)]
    return max((workspace_bytes(m.in_features, m.out_features, rows, dtype, group, kernel.type, act_order=False)
                for m, group in groups if group), default=0)  # rounded to nearest: no act order


def int8_bytes(linear: nn.Linear) -> int:
    return linear.weight.numel() + linear.weight.shape[0] * INT8_SCALE_BYTES


def unique_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers, a tied weight counted once."""
    seen, out = set(), []
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append(tensor)
    return out


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype) -> int:
    """Floating parameters load in `dtype`; buffers (GPTQ's packed words and scales, an int4
    embedding's float32 scales, rotary frequencies) keep the dtype the model declares them in, as
    checkpoint/skeleton.py loads them."""
    itemsize = dtype.itemsize if isinstance(tensor, nn.Parameter) and tensor.is_floating_point() \
        else tensor.dtype.itemsize
    return tensor.numel() * itemsize
