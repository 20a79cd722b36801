"""Weight-only int8 linears for the draft model (a draft approximation: verification never reads
the draft's probabilities, so the output stays exactly the target's).

Each output row w_j gets one scale s_j = max|w_j| / 127 and stores q_j = round(w_j / s_j), so
|w - s q| <= s / 2 per weight. On a CPU the product runs in torch's `_weight_int8pack_mm`, which
reads a quarter of fp32's bytes and, where bf16 has no hardware support, multiplies several
times faster than a bf16 matmul.
"""

import torch
from torch import nn

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # activations the kernel accepts


class Int8Linear(nn.Module):
    """y = x (s * q)^T + b with int8 q [out, in] and per-row scales s [out]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        scales = weight.detach().float().abs().amax(dim=1).clamp(min=1e-12) / 127
        quantized = (weight.detach().float() / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight", quantized)
        self.register_buffer("scales", scales.to(weight.dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if x.device.type == "cpu" and x.dtype in KERNEL_DTYPES:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales.to(x.dtype))
        else:  # no kernel for this device or dtype: the same product, dequantized
            out = flat @ (self.weight.to(x.dtype) * self.scales.to(x.dtype)[:, None]).t()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return self.weight.to(self.scales.dtype) * self.scales[:, None]


def quantize_linears(module: nn.Module) -> int:
    """Replace every nn.Linear inside `module` by an Int8Linear; returns how many were replaced."""
    replaced = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child.weight, child.bias))
            replaced += 1
        else:
            replaced += quantize_linears(child)
    return replaced
