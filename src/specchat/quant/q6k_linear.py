"""A linear multiplying by a Q6Weight (quant/q6k.py), 8.6 bits a weight instead of bf16's 16: an
LM head where memory is short, and the Q6_K linears of decoder layers that stream, whose bytes
then cross the link as the GGUF stores them (plan/budget.py chooses either only where it pays).

No torch kernel multiplies Q6_K's groups of 16 (the int4 kernels take groups of 32 or more, the
int8 one a scale per row), so the weight is expanded a chunk of output rows (CHUNK_WEIGHTS
weights) at a time into the input's dtype, in buffers reused from chunk to chunk (fresh ones per
chunk cost page faults: 0.56 s a call against 0.04 s for the 1.5B's head here), and multiplied.
The rows are the dense conversion's exactly: gguf's float32 dequantization, rounded once to the
dtype. Each call expands the whole weight: for the 1.5B's head ~40 ms on the avx512_bf16 EPYC
against ~16 ms dense (~87 ms on an AVX2 EPYC, two threads), the price of 0.22 GB. From
`widened_from` rows (set where a CPU without half instructions multiplies faster in float32:
quant/widened.py) the rounded chunk is widened back to float32, exactly, and multiplied in
float32, the product rounded once.
"""

import math

import torch
from torch import Tensor, nn

from specchat.quant.q6k import Q6_K_BLOCK, Q6_K_SUB, Q6_SUFFIXES, Q6Weight

# Weights expanded at once, a chunk being this many weights' worth of whole output rows: its float32
# and bf16 copies (6 MB together) stay in cache between the expansion, the rounding and the product.
# Against 3 M weights (2048 of the 1.5B's head's rows) a call took 0.54x as long in a disk-tier
# reply on an AVX2 EPYC, 0.35-0.84x alone (docs/benchmarks.md, "Q6_K chunks").
CHUNK_WEIGHTS = 1 << 20
VALUES, SCALES, D = (suffix.removeprefix(".") for suffix in Q6_SUFFIXES)


class Q6Linear(nn.Module):
    """y = x W^T + b for a Q6Weight W (an LM head, or a layer's Q6_K linear when its layers
    stream), buffers named as the checkpoint's; `dtype` is the bias's."""

    widened_from: float = math.inf  # inputs of at least this many rows multiply in float32 (a CPU's)

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer(VALUES, torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer(SCALES, torch.empty(out_features, in_features // Q6_K_SUB, dtype=torch.int8))
        self.register_buffer(D, torch.empty(out_features, in_features // Q6_K_BLOCK, dtype=torch.float32))
        self.register_buffer("bias", torch.empty(out_features, dtype=dtype) if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        out = flat.new_empty(flat.shape[0], self.out_features)
        stored = Q6Weight(getattr(self, VALUES), getattr(self, SCALES), getattr(self, D))
        rows = chunk_rows(self.in_features, self.out_features)
        expanded = torch.empty(rows, self.in_features, device=x.device)  # float32, as gguf computes
        scale = torch.empty(rows, self.in_features // Q6_K_SUB, device=x.device)
        # in float32 the rounding to the dtype is the identity: the expansion is the weight
        weight = expanded if flat.dtype == torch.float32 else torch.empty_like(expanded, dtype=flat.dtype)
        widened = flat.shape[0] >= self.widened_from
        inputs = flat.float() if widened else flat
        part = inputs.new_empty(flat.shape[0] * rows)  # a chunk's product, made once per call
        for start in range(0, self.out_features, rows):
            n = min(rows, self.out_features - start)
            stored.dequantize_into(slice(start, start + n), expanded[:n], scale[:n])
            if weight is not expanded:
                weight[:n].copy_(expanded[:n])  # rounded once to the dtype: the model's weights
            # widened: those weights in float32 again (exactly), their float32 product rounded once
            operand = expanded[:n].copy_(weight[:n]) if widened else weight[:n]
            out[:, start:start + n] = torch.mm(inputs, operand.t(), out=part[:flat.shape[0] * n].view(-1, n))
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def workspace(self, dtype: torch.dtype) -> int:
        """Bytes of the chunk buffers a call allocates, whatever its rows (rows_workspace: the rest)."""
        return workspace_bytes(self.in_features, self.out_features, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q6_K"


def chunk_rows(in_features: int, out_features: int) -> int:
    """Output rows expanded at once: CHUNK_WEIGHTS' worth, at least one, at most the weight's own
    (a small linear's buffers sized for a whole chunk cost a call page faults: a 256-row v_proj
    took 0.44 ms a call so against 0.13 ms)."""
    return min(max(1, CHUNK_WEIGHTS // in_features), out_features)


def workspace_bytes(in_features: int, out_features: int, dtype: torch.dtype) -> int:
    """A Q6Linear call's chunk buffers: float32 values and scales, and the weight in `dtype` (the
    values themselves in float32)."""
    rounded = 0 if dtype == torch.float32 else dtype.itemsize
    return chunk_rows(in_features, out_features) * (in_features * (4 + rounded) + in_features // Q6_K_SUB * 4)


def rows_workspace(in_features: int, out_features: int, dtype: torch.dtype, rows: int, widened: bool) -> int:
    """What a call over `rows` input rows adds to the chunk buffers, its output aside: a chunk's
    product in `dtype`, or widened, the input and that product in float32."""
    product = rows * chunk_rows(in_features, out_features)
    return 4 * (rows * in_features + product) if widened else product * dtype.itemsize
