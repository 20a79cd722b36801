"""A 4-bit weight times a few to a few hundred input rows in one Triton kernel, each weight tile
expanded in registers as the product reads it: for a draft's steps on CUDA.

A draft's step multiplies 1-256 tree rows by every weight of the draft. On an H200 (2026-11-28)
torch's fused int4 kernel took 4.2 ms for an 8192 x 28672 weight at 256 rows (0.23 ms dense in
bf16), and CUDA's expansion (int4_expand) writes the whole weight in bf16 at every call (0.9 ms
there at any width): a 4-bit 8B draft stepped in 25-115 ms. Here the weight's bytes are read once
a row block, at 4 bits, and the multiply runs on the tensor cores.

Two sources of the same weight: `gemm_words` stores weight (o, i) as nibble i % 8 (bits
4 (i % 8) .. 4 (i % 8) + 3) of int32 word [i // 8, o], so that a tile of inputs by outputs loads
whole words along the outputs (`w4a16_linear`); or the packed bytes an Int4Linear already holds,
read through int4_layout's TileLayout as int4_expand reads them (`w4a16_tiled_linear`: no second
copy of the weight, an index lookup a weight more). Either way
w[o, i] = (q - 8) * scale[g, o] + zero[g, o] with g = i // group_size, in float32, rounded once to
the input's dtype before the product (the scales_and_zeros an Int4Linear holds, [G, O, 2]).
The product accumulates in float32. A draft may be approximated freely (SpecExec's verifier never
reads its probabilities), so the order of that sum is the kernel's own; a target's linears never
run this kernel (widths.in_registers).

Triton is imported only when the kernel runs; the kernel is decorated per interpreter mode, as
int4_expand's is (TRITON_INTERPRET=1 runs it on a CPU, which the tests do). Triton 3.9's
interpreter multiplies a bfloat16 tl.dot's bits as integers (a 16 x 16 product off by 2.5e10) and
truncates a float32 -> bfloat16 cast, so under it the weights are rounded on their bits and the
tiles multiplied in float32: the same values, products (exact in float32) and sums as a GPU's.
"""

import math
from functools import cache
from typing import Any

import torch
from torch import Tensor

from specchat.errors import SpecchatError
from specchat.quant.gemm_blocks import Blocks, blocks_for, launch_fitted
from specchat.quant.gptq import pack_int4_rows
from specchat.quant.int4_expand import check_expansion
from specchat.quant.int4_layout import TileLayout
from specchat.quant.int4_pack import unpack_nibbles
from specchat.quant.int4_weight import Int4Weight

GEMM_DTYPES = (torch.bfloat16, torch.float16)


def gemm_words(weight: Int4Weight) -> Tensor:
    """An Int4Weight's values as int32 words [I/8, O]: input 8r + k of output o in nibble k of [r, o]."""
    return pack_int4_rows(unpack_nibbles(weight.nibbles).t())


@cache
def _kernel(interpret: bool) -> Any:
    """The kernel, decorated under TRITON_INTERPRET as it is now (`interpret` only keys the cache)."""
    import triton
    import triton.language as tl

    @triton.jit
    def w4a16(x_ptr, words_ptr, natural_ptr, scales_and_zeros_ptr, out_ptr, rows, out_features, in_features,
              group_size, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
              UPCAST: tl.constexpr, ROUND_BF16: tl.constexpr, TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr,
              HOISTED: tl.constexpr):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # input rows
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # outputs
        rows_in = m < rows
        outs_in = n < out_features
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        share = (in_features + SPLITS * BLOCK_K - 1) // (SPLITS * BLOCK_K) * BLOCK_K  # this program's inputs
        start = tl.program_id(2) * share
        if HOISTED:  # steps of whole tiles: every step reads its tiles' bytes in the same places
            position = tl.load(natural_ptr + (n % TILE_ROWS)[None, :] * TILE_COLS
                               + (tl.arange(0, BLOCK_K) % TILE_COLS)[:, None]).to(tl.int32)
        for first in range(start, tl.minimum(start + share, in_features), BLOCK_K):
            k = first + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + m.to(tl.int64)[:, None] * in_features + k[None, :], mask=rows_in[:, None], other=0.0)
            if TILE_ROWS == 0:  # gemm_words: each word serves 8 inputs, its 8 loads one cache line
                word = tl.load(words_ptr + (k // 8).to(tl.int64)[:, None] * out_features + n[None, :],
                               mask=outs_in[None, :], other=0)
                q = (word >> (4 * (k % 8))[:, None]) & 0xF  # [BLOCK_K, BLOCK_N]
            else:  # torch's tiles, read as int4_expand reads them (its docstring gives the indexing)
                half: tl.constexpr = TILE_ROWS * TILE_COLS // 2
                tile = (n // TILE_ROWS).to(tl.int64)[None, :] * (in_features // TILE_COLS) + (k // TILE_COLS)[:, None]
                if not HOISTED:
                    position = tl.load(natural_ptr + (n % TILE_ROWS)[None, :] * TILE_COLS + (k % TILE_COLS)[:, None])
                    position = position.to(tl.int32)
                byte = tl.load(words_ptr + tile * half + position % half, mask=outs_in[None, :], other=0).to(tl.int32)
                q = (byte >> (4 * (position // half))) & 0xF
            pair = scales_and_zeros_ptr + ((first // group_size).to(tl.int64) * out_features + n) * 2  # BLOCK_K | group
            scale = tl.load(pair, mask=outs_in, other=0.0).to(tl.float32)
            zero = tl.load(pair + 1, mask=outs_in, other=0.0).to(tl.float32)
            w = (q.to(tl.float32) - 8.0) * scale[None, :] + zero[None, :]
            if UPCAST:  # the interpreter: as a GPU rounds and multiplies, in float32
                if ROUND_BF16:  # to nearest even on the bits, as int4_expand does (a cast truncates here)
                    bits = w.to(tl.uint32, bitcast=True)
                    w = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).to(tl.float32, bitcast=True)
                else:
                    w = w.to(x_ptr.dtype.element_ty).to(tl.float32)
                acc += tl.dot(x.to(tl.float32), w)  # products of two 16-bit floats are exact in float32
            else:
                acc += tl.dot(x, w.to(x_ptr.dtype.element_ty))
        # SPLITS > 1: float32 shares [SPLITS, rows, O], summed by the caller
        share_out = out_ptr + tl.program_id(2).to(tl.int64) * rows * out_features
        tl.store(share_out + m.to(tl.int64)[:, None] * out_features + n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=rows_in[:, None] & outs_in[None, :])

    return w4a16


def check_gemm(x: Tensor, words: Tensor, scales_and_zeros: Tensor, group_size: int) -> None:
    """SpecchatError, in one line, where the arguments describe no product the kernel takes."""
    in_features, out_features = words.shape[0] * 8, words.shape[1]
    check_inputs(x, in_features, group_size)
    if words.dtype != torch.int32 or not words.is_contiguous():
        raise SpecchatError(f"words must be contiguous int32 [I/8, O] (gemm_words); got {words.dtype}")
    if scales_and_zeros.shape != (in_features // group_size, out_features, 2) or in_features % group_size \
            or not scales_and_zeros.is_contiguous():
        raise SpecchatError(f"scales_and_zeros must be a contiguous [{in_features} / {group_size}, {out_features}, 2]; "
                            f"got {tuple(scales_and_zeros.shape)}")


def check_inputs(x: Tensor, in_features: int, group_size: int) -> None:
    if x.dim() != 2 or x.shape[1] != in_features or x.dtype not in GEMM_DTYPES or not x.is_contiguous():
        raise SpecchatError(f"x must be a contiguous [rows, {in_features}] in {GEMM_DTYPES}; got {tuple(x.shape)} "
                            f"{x.dtype}")
    if group_size % 16:  # tl.dot takes 16 inputs at least, and a program's inputs lie in one group
        raise SpecchatError(f"groups of {group_size} inputs: the kernel needs a multiple of 16")


def w4a16_linear(x: Tensor, words: Tensor, scales_and_zeros: Tensor, group_size: int,
                 blocks: Blocks | None = None) -> Tensor:
    """x [rows, I] @ w.T in x's dtype, w [O, I] the 4-bit weight of `words` ([I/8, O]) and
    `scales_and_zeros` ([G, O, 2]); each weight tile expanded in registers (`blocks`: blocks_for's
    unless given)."""
    check_gemm(x, words, scales_and_zeros, group_size)
    return launch(x, words, None, scales_and_zeros, group_size, words.shape[1], blocks)


def w4a16_tiled_linear(x: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int,
                       layout: TileLayout, blocks: Blocks | None = None) -> Tensor:
    """The same product, the weight read from torch's packed int4 layout (`layout`: int4_layout's
    reading of it) where an Int4Linear holds it: no second copy of the weight."""
    out_features, in_features = check_expansion(packed, scales_and_zeros, group_size, layout, x.dtype)
    check_inputs(x, in_features, group_size)
    return launch(x, packed.reshape(-1).view(torch.uint8), layout, scales_and_zeros, group_size, out_features, blocks)


def launch(x: Tensor, weight: Tensor, layout: TileLayout | None, scales_and_zeros: Tensor, group_size: int,
           out_features: int, blocks: Blocks | None) -> Tensor:
    """The product with `blocks` as given (a sweep's: those a card cannot hold raise), or with
    blocks_for's, fitted to the card's shared memory."""
    def run(chosen: Blocks) -> Tensor:
        return run_kernel(x, weight, layout, scales_and_zeros, group_size, out_features, chosen)

    if blocks is not None:
        return run(blocks)
    tiles = None if layout is None else (layout.rows, layout.cols)
    return launch_fitted((x.device, x.dtype, tiles), blocks_for(x.shape[0]), run)


def run_kernel(x: Tensor, weight: Tensor, layout: TileLayout | None, scales_and_zeros: Tensor, group_size: int,
               out_features: int, blocks: Blocks) -> Tensor:
    import triton

    rows = x.shape[0]
    out = torch.empty(blocks.splits, rows, out_features, dtype=x.dtype if blocks.splits == 1 else torch.float32,
                      device=x.device)
    grid = (triton.cdiv(rows, blocks.rows), triton.cdiv(out_features, blocks.outs), blocks.splits)
    block_k = math.gcd(blocks.ins, group_size)
    interpret = bool(triton.knobs.runtime.interpret)
    _kernel(interpret)[grid](
        x, weight, weight if layout is None else layout.natural, scales_and_zeros, out, rows, out_features,
        x.shape[1], group_size, BLOCK_M=blocks.rows, BLOCK_N=blocks.outs, BLOCK_K=block_k,
        SPLITS=blocks.splits, UPCAST=interpret, ROUND_BF16=x.dtype == torch.bfloat16,
        TILE_ROWS=0 if layout is None else layout.rows, TILE_COLS=0 if layout is None else layout.cols,
        HOISTED=layout is not None and block_k % layout.cols == 0, num_warps=blocks.warps, num_stages=blocks.stages,
        enable_fp_fusion=False)  # (q - 8) * scale + zero as the interpreter computes it (exact with 16-bit scales)
    return out[0] if blocks.splits == 1 else out.sum(0).to(x.dtype)
