"""Int8 linears for the draft model (a draft approximation: verification never reads the
draft's probabilities, so the output stays exactly the target's).

Each output row w_j gets one scale s_j = max|w_j| / 127 and stores q_j = round(w_j / s_j), so
|w - s q| <= s / 2 per weight. On a CPU with x86's quantized engine (fbgemm) the product runs as
a dynamic int8 linear: the input is quantized on the fly to 7 bits over its range, one scale a
and zero point z for all its rows, x ~ a (p - z), and y = a s ((p - z) . q) is an int8 dot
product per output, 1.6-2.8x faster than a bf16 matmul at every width on an avx512_vnni CPU
(measured: docs/benchmarks.md). Elsewhere on a CPU it runs in torch's `_weight_int8pack_mm`
(weight-only int8, activations as given), which reads a quarter of fp32's bytes but, with
avx512_bf16, is slower than a bf16 matmul from a few rows on.
quant/widths.py measures, on the machine at hand, up to how many rows int8 wins; an `Int8Linear` can
keep the dense weight beside its int8 copy and multiply wider inputs with it, so a draft's
narrow steps read fewer bytes and its wide steps lose nothing.
"""

import warnings

import torch
from torch import nn


KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # activations the kernels accept
DYNAMIC_ENGINES = ("x86", "fbgemm")  # quantized engines whose dynamic int8 linear is fbgemm's
# torch 2.13's avx512_bf16 path of the kernel crashes (SIGSEGV) on bf16 inputs of more than one row
# when in_features is not a multiple of 16; every real model's widths are multiples of 64.
KERNEL_IN_MULTIPLE = 16
DEQUANT_ROWS = 1024  # output rows dequantized at once where no int8 kernel runs: 1024 x in_features temporary
QUANT_ROWS = 256  # rows quantized at once: float32 temporaries of 256 x in_features (quantize_rows)
# The start of the UserWarning torch 2.13 raises (Quantizer.cpp) on creating a quantized tensor
QUANTIZED_TENSOR_NOTICE = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor"


class Int8Linear(nn.Module):
    """y = x (s * q)^T + b with int8 q [out, in] and per-row scales s [out], on fbgemm's dynamic
    kernel where it runs unless `dynamic` is False; with `dense_above` set, inputs of more rows use
    the dense `weight`, kept beside the int8 copy."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dense_above: int | None = None,
                 dynamic: bool = True, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        dtype = dtype or weight.dtype  # of the scales and the dense copy (`weight` may be a float32 file's)
        quantized, scales = quantize_rows(weight.detach())
        # fbgemm's packed copy replaces the int8 rows where its kernel runs: one copy in memory
        self.packed = pack_dynamic(quantized, scales, bias) if dynamic and dynamic_kernel(weight.device) else None
        self.register_buffer("weight", quantized if self.packed is None else None)
        self.register_buffer("scales", scales.to(dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("dense", None if dense_above is None else weight.detach().to(dtype))
        self.dense_above = dense_above
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.dense is not None and flat.shape[0] > self.dense_above:
            out = nn.functional.linear(flat, self.dense, self.bias)
            return out.reshape(*x.shape[:-1], self.out_features)
        if self.packed is not None and x.device.type == "cpu" and x.dtype in KERNEL_DTYPES:
            # reduce_range: 7-bit activations, so fbgemm's int16 pair sums cannot saturate
            out = torch.ops.quantized.linear_dynamic(flat.float(), self.packed, True).to(x.dtype)
            return out.reshape(*x.shape[:-1], self.out_features)
        if has_int8_kernel(x.device) and x.dtype in KERNEL_DTYPES and self.in_features % KERNEL_IN_MULTIPLE == 0:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales.to(x.dtype))
        else:  # no kernel for this device or dtype: the same product, dequantized a block of rows at a time
            out = dequantized_product(flat, self.int8_rows(), self.scales.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def int8_rows(self) -> torch.Tensor:
        """q [out, in], from the packed copy where there is one."""
        return self.weight if self.packed is None else torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()

    def dequantized(self) -> torch.Tensor:
        return self.int8_rows().to(self.scales.dtype) * self.scales[:, None]


class Int8Embedding(nn.Module):
    """An embedding lookup over int8 rows q [V, H] with a scale s_v per row, as Int8Linear stores
    a weight: row v = s_v q_v, within s_v / 2 of the dense row per weight (a draft approximation)."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        rows, scales = quantize_rows(weight.detach())
        self.register_buffer("rows", rows)
        self.register_buffer("scales", scales)
        self.dtype = dtype or weight.dtype  # of the rows looked up
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = self.rows[flat].float() * self.scales[flat, None]
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 q [out, in] and float32 scales s [out] with s_j = max|w_j| / 127, q_j = round(w_j / s_j),
    computed QUANT_ROWS rows at a time: the float32 temporaries are a block's, never the whole
    weight's (a draft loading layer by layer holds little else beside its int8 layers)."""
    quantized = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for block in row_blocks(weight.shape[0], QUANT_ROWS):
        rows = weight[block].float()
        scales[block] = rows.abs().amax(dim=1).clamp(min=1e-12) / 127
        quantized[block] = (rows / scales[block, None]).round().clamp(-127, 127).to(torch.int8)
    return quantized, scales


def has_int8_kernel(device: torch.device) -> bool:
    """Whether torch's weight-only int8 kernel is built for `device` (CPU always; CUDA in builds
    that ship it): asked of the dispatcher, never assumed."""
    key = "CPU" if device.type == "cpu" else device.type.upper()
    return torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", key)


def dequantized_product(x: torch.Tensor, rows: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (s * q)^T with q dequantized DEQUANT_ROWS output rows at a time: the temporary is
    DEQUANT_ROWS x in_features, never the whole weight (a 7B draft's 11008 x 4096 MLP would take
    90 MB in bf16 on every call)."""
    out = x.new_empty(x.shape[0], rows.shape[0])
    for block in row_blocks(rows.shape[0], DEQUANT_ROWS):
        out[:, block] = x @ (rows[block].to(x.dtype) * scales[block, None]).t()
    return out


def row_blocks(count: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


def dynamic_kernel(device: torch.device) -> bool:
    """Whether fbgemm's dynamic int8 linear serves weights on `device`."""
    return device.type == "cpu" and torch.backends.quantized.engine in DYNAMIC_ENGINES


def pack_dynamic(quantized: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> object:
    """The int8 rows and their scales, packed for `quantized::linear_dynamic` (bias in fp32)."""
    with warnings.catch_warnings():
        # torch 2.13 deprecates quantized tensors (moving them to torchao, not a dependency here),
        # yet its fbgemm kernel takes its weight only packed from one: silence that notice alone.
        warnings.filterwarnings("ignore", QUANTIZED_TENSOR_NOTICE, UserWarning)
        weight = torch._make_per_channel_quantized_tensor(
            quantized, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(weight, None if bias is None else bias.detach().float())


def quantize_linears(module: nn.Module, dense_above: int | None = None) -> int:
    """Replace every nn.Linear inside `module` by an Int8Linear (keeping the dense weight for
    inputs of more than `dense_above` rows, when set); returns how many were replaced."""
    replaced = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child.weight, child.bias, dense_above))
            replaced += 1
        else:
            replaced += quantize_linears(child, dense_above)
    return replaced


class Bank(nn.Module):
    """Linears of one shape, each applied to the same input: a layer's worth of weight reads."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> None:
        for layer in self.layers:
            layer(x)


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An nn.Linear multiplying by `weight` [out, in] and adding `bias` themselves (not copies),
    for inference. skip_init: a random initialization of weights about to be replaced costs a
    pass over every weight (a 17920 x 1536 linear took 184 ms here, once)."""
    linear = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None,
                                device=weight.device, dtype=weight.dtype)
    linear.weight.data = weight
    if bias is not None:
        linear.bias.data = bias
    return linear.requires_grad_(False)
