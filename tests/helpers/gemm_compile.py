"""int4_gemm's kernel compiled for a GPU on this CPU (Triton's wheel brings ptxas): the machine code
a card would load, and the shared memory it needs, without the card."""

from typing import Any

import pytest

from specchat.quant.gemm_blocks import Blocks

CUDA_TILES = (8, 128)  # CUDA's packed int4 tiles (int4_layout), as a draft's Int4Linear holds them
WORDS = (0, 0)  # gemm_words' int32 words


def compiled(blocks: Blocks, arch: int, tiles: tuple[int, int] = CUDA_TILES) -> Any:
    """The kernel with `blocks`, reading `tiles`, compiled for sm_`arch` (bf16 inputs)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from specchat.quant.int4_gemm import _kernel

    with pytest.MonkeyPatch.context() as patch:  # decorated for a GPU, not for the interpreter
        patch.delenv("TRITON_INTERPRET", raising=False)
        kernel = _kernel(False)
    pointers = {"x_ptr": "*bf16", "words_ptr": "*u8" if tiles[0] else "*i32", "natural_ptr": "*i64",
                "scales_and_zeros_ptr": "*bf16", "out_ptr": "*bf16"}
    numbers = dict.fromkeys(("rows", "out_features", "in_features", "group_size"), "i32")
    constants = {"BLOCK_M": blocks.rows, "BLOCK_N": blocks.outs, "BLOCK_K": blocks.ins, "SPLITS": blocks.splits,
                 "UPCAST": False, "ROUND_BF16": True, "TILE_ROWS": tiles[0], "TILE_COLS": tiles[1],
                 "HOISTED": tiles[1] > 0 and blocks.ins % tiles[1] == 0}
    signature = pointers | numbers | dict.fromkeys(constants, "constexpr")
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"enable_fp_fusion": False, "num_warps": blocks.warps, "num_stages": blocks.stages})
