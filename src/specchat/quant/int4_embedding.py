"""An input embedding kept in its stored 4 bits: only the rows looked up are expanded.

A GGUF's token embedding is Q4_K like its linears (the embedded 1.5B's: 151,936 x 1,536). Dense,
it takes 0.47 GB in bf16; as an Int4Weight (quant/int4_weight.py) 0.17 GB: nibbles [V, H/2] and a
float32 scale and zero per 32 weights. A lookup expands the rows it reads,
  row[v] = (q[v] - 8) * scale[:, v] + zero[:, v]   (per group of 32, in float64: exact),
rounded once to float32, as Int4Weight.dequantize computes the whole weight, then to the model's
dtype: the values the dense conversion holds, rounded as a dense embedding rounds them.
"""

import torch
from torch import Tensor, nn

from specchat.quant.int4_checkpoint import INT4_SUFFIXES
from specchat.quant.int4_weight import Int4Weight

NIBBLES, SCALES, ZEROS = (suffix.removeprefix(".") for suffix in INT4_SUFFIXES)


class Int4Embedding(nn.Module):
    """nn.Embedding's lookup over an Int4Weight's buffers, named as the checkpoint names them."""

    def __init__(self, num_embeddings: int, embedding_dim: int, groups: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.dtype = num_embeddings, embedding_dim, dtype
        self.register_buffer(NIBBLES, torch.empty(num_embeddings, embedding_dim // 2, dtype=torch.uint8))
        self.register_buffer(SCALES, torch.empty(groups, num_embeddings, dtype=torch.float32))
        self.register_buffer(ZEROS, torch.empty(groups, num_embeddings, dtype=torch.float32))

    def forward(self, ids: Tensor) -> Tensor:
        rows = ids.reshape(-1)
        looked_up = Int4Weight(getattr(self, NIBBLES)[rows], getattr(self, SCALES)[:, rows],
                               getattr(self, ZEROS)[:, rows], None)  # the rows as a weight of their own
        return looked_up.dequantize().to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, 4-bit"
