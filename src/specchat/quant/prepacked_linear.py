"""Dense linears on a CPU with their weights prepacked, once, in the blocked layout oneDNN's inner
product reads.

nn.Linear hands oneDNN a plain [out, in] weight on every call. Prepacked, the same bytes stream
faster at the widths decoding runs: on the project's machine (2 cores with avx512_bf16), one row
through the 1.5B's LM head took 11 ms against 15.5 ms, through an 8960 -> 1536 down_proj 0.32 ms
against 0.81 ms, and a one-token pass of the packed target 50 ms against 60. The outputs were
bitwise F.linear's at every width measured there (1 to 257 rows). Whether it pays is measured
once per machine (quant/widths.py's `prepack_pays`); where oneDNN has no kernel for the dtype,
nn.Linear stays.

The prepacked weight is an opaque oneDNN tensor: same bytes as the plain one (`nbytes`), no data
pointer. Repacking allocates the packed copy beside the plain one, which is freed after it, so a
weight is repacked only where the plan leaves that room (`prepack_linears`' `room`).
"""

import torch
from torch import Tensor, nn

PREPACKED_DTYPES = (torch.bfloat16,)  # oneDNN's inner product takes a packed float32 weight only through MKL


class PrepackedLinear(nn.Module):
    """y = x W^T + b with W [out, in] prepacked for oneDNN (buffer `packed_weight`)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed_weight", prepack(weight))
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "PrepackedLinear":
        return cls(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def forward(self, x: Tensor) -> Tensor:
        # contiguous: F.linear's own results are those of a contiguous input (a strided one takes
        # another path and other bits)
        flat = x.reshape(-1, self.in_features).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked for oneDNN"


def prepack(weight: Tensor) -> Tensor:
    """`weight` [out, in] in oneDNN's blocked layout for its inner product (batch size hint 1: decoding)."""
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight, 1)
