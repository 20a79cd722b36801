"""Which int4 product serves which input width, measured once per process on the machine at hand.

The fused kernels win on narrow inputs (one token, draft steps): they read each packed weight once
and never write it out. On wide ones (tree passes, prompts) dequantizing chunks for a dense matmul
wins, sooner or later depending on the CPU (vector width, bf16 instructions) or GPU. So nothing
about it is fixed here: a probe times both on a PROBE_SHAPE weight at PROBE_ROWS widths
(quant.timing: the fastest of a few runs each, the two in turns) and keeps the widest run of
widths at which the fused kernel won. It also times the chunked product in float32 against the
input's dtype (2-5x apart either way on CPUs with and without bf16 instructions) and keeps the
faster. 0.6 s on the 2-core AVX2 dev machine with one thread; seconds when the machine is busy
with other work.
"""

import math
from dataclasses import dataclass
from functools import cache

import torch

from specchat.errors import SpecchatError
from specchat.quant import timing
from specchat.quant.int4_chunks import chunked_linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import pack
from specchat.quant.timing import LinearShape

PROBE_SHAPE = LinearShape(1024, 1024)  # 0.5 MB packed, so that the slow side of a wide probe stays short
PROBE_GROUP = 32  # GGUF Q4_K's groups, the smallest: the most scales to read
PROBE_ROWS = (1, 4, 16, 64, 256)  # a token, small and wide trees
WIDE_ROWS = 64  # where the chunked product's dtype is chosen: a tree pass
UNLIMITED = math.inf
FUSED_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16), "cuda": (torch.bfloat16,)}


@dataclass(frozen=True)
class WidthChoice:
    fused_rows: float  # inputs of at most this many rows run the fused kernel (0: never; inf: always)
    product: torch.dtype  # the dense product's dtype for wider inputs


@cache
def width_choice(device_type: str, dtype: torch.dtype) -> WidthChoice:
    """The measured choice for inputs of `dtype` on `device_type`, probed once per process."""
    device = torch.device(device_type)
    fuses = dtype in FUSED_DTYPES.get(device_type, ())
    layout = layout_for(device, PROBE_SHAPE.in_features)
    if layout is None:
        if not fuses:
            raise SpecchatError(f"no int4 product for {dtype} on {device_type}: its fused kernel takes no {dtype} and "
                                f"torch {torch.__version__}'s layout there cannot be read back")
        return WidthChoice(UNLIMITED, dtype)
    packed, scales_and_zeros, x = probe_operands(device, dtype)

    def chunked(rows: int, product: torch.dtype) -> torch.Tensor:
        return chunked_linear(x[:rows], packed, scales_and_zeros, PROBE_GROUP, layout, product)

    def fused(rows: int) -> torch.Tensor:
        return fused_linear(x[:rows], packed, scales_and_zeros, PROBE_GROUP)

    product = torch.float32
    if dtype != torch.float32 and timing.faster(lambda: chunked(WIDE_ROWS, dtype),
                                                lambda: chunked(WIDE_ROWS, torch.float32), device):
        product = dtype
    if not fuses:
        return WidthChoice(0, product)
    wins = timing.widest_win(PROBE_ROWS, fused, lambda rows: chunked(rows, product), device)
    return WidthChoice(UNLIMITED if wins == PROBE_ROWS[-1] else wins, product)


def probe_operands(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random PROBE_SHAPE weight packed for `device` (its packed data, scales and zeros) and
    input rows, seeded: every process probes the same numbers."""
    generator = torch.Generator().manual_seed(0)
    in_features, out_features = PROBE_SHAPE
    nibbles = torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator)
    scales_and_zeros = torch.rand(in_features // PROBE_GROUP, out_features, 2, generator=generator) / 64
    x = torch.randn(max(PROBE_ROWS), in_features, generator=generator)
    return pack(nibbles, device), scales_and_zeros.to(device, dtype), x.to(device, dtype)


def fused_linear(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    """x [rows, I] @ w.T through torch's fused int4 kernel of x's device."""
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, packed, group_size, scales_and_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group_size, scales_and_zeros)
