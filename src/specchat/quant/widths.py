"""Which product serves a linear at which input width on which device: the policy, every probe that
measures it, the widths each probe times, and how each choice is kept.

A 4-bit linear (Int4Linear) multiplies `rows` inputs by the first of these that applies:
  a CPU's dense copy (int4_dense)   rows >= dense_rows(shape), where the plan kept a copy
  a draft's registers (int4_gemm)   CUDA, rows within gemm_span(shape): tiles expanded in the matmul
  CUDA's expansion (int4_expand)    rows >= expand_rows(shape): Triton expands, cuBLAS multiplies
  the fused kernel (int4_pack)      rows <= width_choice's fused_rows
  the chunked product (int4_chunks) in width_choice's product dtype, past that
A CPU's dense linears are prepacked for oneDNN where `prepack_pays`, else widened to float32 from
`widened_rows` (quant/widened.py; not the dense copies); its float32 ones go through oneDNN over
`onednn_span` (quant/onednn_float.py); a draft's int8 linears serve inputs of up to `int8_rows` rows.

Nothing here is fixed: each of those eight is measured on the machine at hand by racing two products at the widths of
its *_ROWS (quant.timing), then kept per machine, keyed by what it was measured for, with the load it was measured
under (machine_choices.remembered says why). A model's own shapes are timed where launch costs would hide a kernel's
slope on a small probe (expand_rows, dense_rows). Cached in the process, a choice costs a forward no file read.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.machine_choices import Choice, Kept, measured, remembered, write_kept
from specchat.quant import timing
from specchat.quant.int4_chunks import chunked_linear, dequantized
from specchat.quant.int4_expand import expanded_linear
from specchat.quant.int4_gemm import GEMM_DTYPES, w4a16_tiled_linear
from specchat.quant.int4_layout import TileLayout, layout_for
from specchat.quant.int4_pack import FUSED_DTYPES, fused_linear, pack
from specchat.quant.int8 import KERNEL_DTYPES, Bank, Int8Linear, dense_linear
from specchat.quant.onednn_float import measure_onednn_span
from specchat.quant.prepacked_linear import PREPACKED_DTYPES, PrepackedLinear
from specchat.quant.timing import LinearShape
from specchat.quant.widened import measure_widened_rows
from specchat.triton_support import triton_available

CPU = torch.device("cpu")
UNLIMITED = math.inf
# the widths each probe races its two products at
FUSED_ROWS = (1, 4, 16, 64, 256)  # fused kernel against the chunked product: a token, small and wide trees
WIDE_ROWS = 64  # where the chunked product's dtype is chosen: a tree pass
EXPAND_ROWS = (16, 64, 256, 1024)  # CUDA: tree widths at which expanding may start to win
GEMM_ROWS = (1, 4, 16, 64, 256)  # CUDA: a draft's step widths, at which int4_gemm may beat the others
DENSE_ROWS = (2, 4, 8, 16, 32, 64)  # a CPU's dense copy: tree widths (one row keeps the fused kernel)
PREPACK_ROWS = (1, 64)  # prepacked against plain dense: a token, and a tree pass
INT8_ROWS = (1, 2, 4, 8, 16, 32, 64)  # a draft step's rows: the root, a chain, then wider expansions
# the weights they time
WIDTH_SHAPE = LinearShape(1024, 1024)  # 0.5 MB packed, so that the slow side of a wide probe stays short
WIDTH_GROUP = 32  # GGUF Q4_K's groups, the smallest: the most scales to read (the earliest crossover)
EXPAND_GROUP = 128  # GPTQ's usual groups (fewer where a weight has fewer inputs)
PREPACK_SHAPE = LinearShape(8192, 4096)  # 64 MB in bf16, past the caches, as a decoder's weights are
INT8_SHAPE = LinearShape(896, 4864)  # the embedded 0.5B draft's MLP up projection: a typical draft linear
# Distinct weights the int8 probe cycles through, 70 MB in bf16: a single 8.7 MB weight would sit in
# many CPUs' last-level cache and favour the dense kernel (int8 won up to 2 rows on one, at every width on eight).
INT8_LINEARS = 8


@dataclass(frozen=True)
class WidthChoice:
    fused_rows: float  # inputs of at most this many rows run the fused kernel (0: never; inf: always)
    product: torch.dtype  # the chunked product's dtype for wider inputs


def int4_product(linear: nn.Module, flat: Tensor, scales_and_zeros: Tensor) -> Tensor:
    """flat [rows, I] @ w.T for an Int4Linear (typed as a module: int4.py imports this one), by the
    product that serves its width on its device."""
    rows = flat.shape[0]
    if linear.dense is not None and rows >= linear.dense.from_rows:
        return linear.dense.linear(flat)
    layout = layout_for(flat.device, linear.in_features)
    if in_registers(linear, rows):
        return w4a16_tiled_linear(flat.contiguous(), linear.packed, scales_and_zeros, linear.group_size, layout)
    if expands(linear, rows):
        return expanded_linear(flat, linear.packed, scales_and_zeros, linear.group_size, layout)
    choice = linear.widths or width_choice(linear.kernel, flat.dtype)
    return packed_product(flat, linear.packed, scales_and_zeros, linear.group_size, layout, choice)


def expands(linear: nn.Module, rows: int) -> bool:
    """Whether `rows` input rows of an Int4Linear run the expansion (CUDA, unless pinned to the
    fused kernel; a CPU runs Triton only under its interpreter and keeps dense copies instead)."""
    if linear.kernel != "cuda" or linear.widths is not None:
        return False
    return rows >= expand_rows(linear.kernel, linear.in_features, linear.out_features, linear.compute_dtype)


def in_registers(linear: nn.Module, rows: int) -> bool:
    """Whether `rows` rows of a draft's Int4Linear (`int4.use_registers`, unless pinned to the fused
    kernel) run int4_gemm's kernel: on CUDA, over the widths where it measured faster than the rest."""
    if not linear.registers or linear.kernel != "cuda" or linear.widths is not None:
        return False
    span = gemm_span(linear.kernel, linear.in_features, linear.out_features, linear.compute_dtype)
    return span is not None and span[0] <= rows <= span[1]


@cache
def gemm_span(device_type: str, in_features: int, out_features: int, dtype: torch.dtype) -> tuple[int, int] | None:
    """The widths (first and last of GEMM_ROWS, inclusive) over which int4_gemm's kernel multiplies
    faster than the fused kernel or the expansion at this shape; None where it never does or cannot run."""
    if dtype not in GEMM_DTYPES or not tiles_readable(device_type, in_features):
        return None
    key = {"device": device_type, "in_features": in_features, "out_features": out_features, "dtype": str(dtype)}
    span = kept("int4 gemm rows", key)
    return None if span is None else (span[0], span[1])


def tiles_readable(device_type: str, in_features: int) -> bool:  # the expansion's and int4_gemm's need
    return triton_available() and layout_for(torch.device(device_type), in_features) is not None


def packed_product(flat: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int,
                   layout: TileLayout | None, choice: WidthChoice) -> Tensor:
    """The fused kernel up to `choice`'s width (past it too where the layout can't be read back), then chunks."""
    if flat.shape[0] <= choice.fused_rows or layout is None:
        return fused_linear(flat, packed, scales_and_zeros, group_size)
    return chunked_linear(flat, packed, scales_and_zeros, group_size, layout, choice.product)


@cache
def width_choice(device_type: str, dtype: torch.dtype) -> WidthChoice:
    """Up to which width the fused kernel serves inputs of `dtype` on `device_type`, and the
    chunked product's dtype past it (float32 or `dtype`: 2-5x apart either way on CPUs with and
    without bf16 instructions). Unmeasured where the layout cannot be read back: fused throughout."""
    if layout_for(torch.device(device_type), WIDTH_SHAPE.in_features) is None:
        if dtype not in FUSED_DTYPES.get(device_type, ()):
            raise SpecchatError(f"no int4 product for {dtype} on {device_type}: its fused kernel takes no {dtype} and "
                                f"torch {torch.__version__}'s layout there cannot be read back")
        return WidthChoice(UNLIMITED, dtype)
    fused_rows, product = kept("int4 fused widths", {"device": device_type, "dtype": str(dtype)})
    return WidthChoice(fused_rows, getattr(torch, product))


@cache
def expand_rows(device_type: str, in_features: int, out_features: int, dtype: torch.dtype) -> float:
    """The fewest input rows (of EXPAND_ROWS) from which CUDA's expansion and a dense matmul beat the
    fused kernel at this shape; inf where it never does or cannot run; 1 where the fused kernel
    takes no `dtype` (the expansion then beats the chunked product it would fall back on)."""
    if not tiles_readable(device_type, in_features):
        return math.inf
    if dtype not in FUSED_DTYPES[device_type]:
        return 1
    return kept("int4 expansion rows", {"device": device_type, "in_features": in_features,
                                         "out_features": out_features, "dtype": str(dtype)})


@cache
def dense_rows(in_features: int, out_features: int, dtype: torch.dtype) -> int | None:
    """The fewest input rows (of DENSE_ROWS) from which a dense copy of this CPU weight multiplies
    faster than its packed products; None where it never does, or where the layout cannot be read
    back to make the copy."""
    if layout_for(CPU, in_features) is None:
        return None
    return kept("int4 dense copy rows", {"in_features": in_features, "out_features": out_features,
                                          "dtype": str(dtype)})


@cache
def prepack_pays(dtype: torch.dtype) -> bool:
    """Whether a prepacked product of `dtype` is no slower than F.linear at every PREPACK_ROWS width
    on this CPU; False where oneDNN has no kernel for it."""
    if dtype not in PREPACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    return kept("prepacked products pay", {"dtype": str(dtype)})


def int8_rows(dtype: torch.dtype) -> int:
    """Up to how many rows (of INT8_ROWS) a draft's int8 linears beat dense `dtype` ones here at every width (or 0)."""
    if dtype not in KERNEL_DTYPES:
        return 0
    return kept("int8 rows", {"dtype": str(dtype)})


def dense_copy_linear(weight: Tensor) -> nn.Module:
    """`weight` as the dense product that runs it fastest here: prepacked for oneDNN where that pays
    (not widened: so, copies beat the fused kernel from 32 rows, for seconds of every start)."""
    if prepack_pays(weight.dtype):
        return PrepackedLinear(weight, None)
    return dense_linear(weight)


def kept(choice: str, key: dict) -> Choice:
    """The choice as kept for this machine, measured (by MEASURES) where it is not."""
    device = torch.device(key.get("device", "cpu"))
    return remembered(choice, key, device, lambda: MEASURES[choice](**arguments(key)))


def measure_again(choice: Kept) -> Kept:
    """A kept choice measured now and kept, whatever the load (`specchat doctor --measure-again`)."""
    fresh = measured(choice.choice, choice.key, torch.device(choice.device),
                     lambda: MEASURES[choice.choice](**arguments(choice.key)))
    write_kept(fresh)
    return fresh


def arguments(key: dict) -> dict:
    """A choice's key as its probe's arguments (dtypes by name in the file)."""
    return {name: getattr(torch, value.removeprefix("torch.")) if name == "dtype" else value
            for name, value in key.items()}


def measure_widths(device: str, dtype: torch.dtype) -> list:
    """[fused_rows, product dtype's name]: the chunked product's faster dtype at WIDE_ROWS, then the
    widest of FUSED_ROWS up to which the fused kernel wins (inf: at every one)."""
    packed, scales_and_zeros, x = random_int4(torch.device(device), dtype, WIDTH_SHAPE, WIDTH_GROUP, max(FUSED_ROWS))
    layout = layout_for(torch.device(device), WIDTH_SHAPE.in_features)

    def chunked(rows: int, product: torch.dtype) -> Tensor:
        return chunked_linear(x[:rows], packed, scales_and_zeros, WIDTH_GROUP, layout, product)

    product = torch.float32
    if dtype != torch.float32 and timing.faster(lambda: chunked(WIDE_ROWS, dtype),
                                                lambda: chunked(WIDE_ROWS, torch.float32), torch.device(device)):
        product = dtype
    if dtype not in FUSED_DTYPES.get(device, ()):
        return [0, str(product).removeprefix("torch.")]
    wins = timing.widest_win(FUSED_ROWS, lambda rows: fused_linear(x[:rows], packed, scales_and_zeros, WIDTH_GROUP),
                             lambda rows: chunked(rows, product), torch.device(device))
    return [UNLIMITED if wins == FUSED_ROWS[-1] else wins, str(product).removeprefix("torch.")]


def measure_expand_rows(device: str, in_features: int, out_features: int, dtype: torch.dtype) -> float:
    group = math.gcd(EXPAND_GROUP, in_features)  # an expert's 64 inputs: one group of 64
    shape = LinearShape(in_features, out_features)
    packed, scales_and_zeros, x = random_int4(torch.device(device), dtype, shape, group, max(EXPAND_ROWS))
    layout = layout_for(torch.device(device), in_features)
    rows = timing.crossover(EXPAND_ROWS, lambda rows: expanded_linear(x[:rows], packed, scales_and_zeros, group, layout),
                            lambda rows: fused_linear(x[:rows], packed, scales_and_zeros, group), torch.device(device))
    return math.inf if rows is None else rows


def measure_gemm_span(device: str, in_features: int, out_features: int, dtype: torch.dtype) -> list[int] | None:
    group, on = math.gcd(EXPAND_GROUP, in_features), torch.device(device)
    packed, pairs, x = random_int4(on, dtype, LinearShape(in_features, out_features), group, max(GEMM_ROWS))
    layout, expand_from = layout_for(on, in_features), expand_rows(device, in_features, out_features, dtype)
    span = timing.winning_span(  # against what the linear runs at each width otherwise, both as a captured step
        GEMM_ROWS, timing.as_replayed(lambda rows: w4a16_tiled_linear(x[:rows], packed, pairs, group, layout), on),
        timing.as_replayed(lambda rows: expanded_linear(x[:rows], packed, pairs, group, layout) if rows >= expand_from
                           else fused_linear(x[:rows], packed, pairs, group), on), on)
    return None if span is None else list(span)


def measure_dense_rows(in_features: int, out_features: int, dtype: torch.dtype) -> int | None:
    shape = LinearShape(in_features, out_features)
    packed, scales_and_zeros, x = random_int4(CPU, dtype, shape, WIDTH_GROUP, max(DENSE_ROWS))
    layout = layout_for(CPU, in_features)
    dense = dense_copy_linear(dequantized(packed, scales_and_zeros, WIDTH_GROUP, layout, dtype))
    return timing.crossover(DENSE_ROWS, lambda rows: dense(x[:rows]), lambda rows: packed_product(
        x[:rows], packed, scales_and_zeros, WIDTH_GROUP, layout, width_choice("cpu", dtype)), CPU)


def measure_prepack_pays(dtype: torch.dtype) -> bool:
    weight = torch.ones(PREPACK_SHAPE.out_features, PREPACK_SHAPE.in_features, dtype=dtype)
    x = torch.ones(max(PREPACK_ROWS), PREPACK_SHAPE.in_features, dtype=dtype)
    try:
        linear = PrepackedLinear(weight, None)
        linear(x[:1])
    except RuntimeError:  # this oneDNN has no inner product for `dtype` on this CPU: nothing to pack
        return False
    return not any(timing.faster(lambda: nn.functional.linear(x[:rows], weight), lambda: linear(x[:rows]), CPU)
                   for rows in PREPACK_ROWS)


def measure_int8_rows(dtype: torch.dtype) -> int:
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(INT8_SHAPE.out_features, INT8_SHAPE.in_features, generator=generator).to(dtype)
               for _ in range(INT8_LINEARS)]
    dense = Bank([dense_linear(weight) for weight in weights])
    int8 = Bank([Int8Linear(weight, None) for weight in weights])
    x = torch.randn(max(INT8_ROWS), INT8_SHAPE.in_features, generator=generator).to(dtype)
    return timing.widest_win(INT8_ROWS, lambda rows: int8(x[:rows]), lambda rows: dense(x[:rows]), CPU)


def random_int4(device: torch.device, dtype: torch.dtype, shape: LinearShape, group: int,
                rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """A random `shape` weight packed for `device` (its packed data, scales and zeros) and `rows`
    input rows, seeded: every process probes the same numbers."""
    generator = torch.Generator().manual_seed(0)
    nibbles = torch.randint(0, 256, (shape.out_features, shape.in_features // 2), dtype=torch.uint8,
                            generator=generator)
    scales_and_zeros = torch.rand(shape.in_features // group, shape.out_features, 2, generator=generator) / 64
    x = torch.randn(rows, shape.in_features, generator=generator)
    return pack(nibbles, device), scales_and_zeros.to(device, dtype), x.to(device, dtype)


MEASURES: dict[str, Callable[..., Choice]] = {
    "int4 fused widths": measure_widths,
    "int4 expansion rows": measure_expand_rows,
    "int4 gemm rows": measure_gemm_span,
    "int4 dense copy rows": measure_dense_rows,
    "prepacked products pay": measure_prepack_pays,
    "int8 rows": measure_int8_rows,
    "widened rows": measure_widened_rows,
    "oneDNN float32 rows": measure_onednn_span,
}
