"""gemm_blocks: the blocks int4_gemm runs, stepped down to what a card's shared memory holds. The
cards' limits are Triton's own check at launch; here a stand-in raises it where the blocks, compiled
for that card on this CPU, need more than the card has."""

from collections.abc import Callable
from functools import cache

import pytest
import torch
from helpers.gemm_compile import CUDA_TILES, WORDS, compiled

from specchat.quant import gemm_blocks
from specchat.quant.gemm_blocks import Blocks, blocks_for, launch_fitted, smaller

OutOfResources = pytest.importorskip("triton.runtime.errors", reason="triton is not installed (the test extra "
                                     "installs it on x86-64 Linux)").OutOfResources

SM89_SHARED = 101376  # an RTX 4090's (sm_89) and an RTX 3090's (sm_86) shared memory a block, opted in
SM90_SHARED = 232448  # an H100's and H200's


@pytest.fixture(autouse=True)
def fitted(monkeypatch) -> dict:
    table: dict = {}
    monkeypatch.setattr(gemm_blocks, "FITTED", table)
    return table


def test_smaller_blocks_take_fewer_stages_then_fewer_inputs_outputs_and_rows():
    chain, blocks = [], Blocks(32, 32, 32, 1, warps=4, stages=4)
    while (blocks := smaller(blocks)) is not None:
        chain.append(blocks)
    assert chain == [Blocks(32, 32, 32, 1, 4, 3), Blocks(32, 32, 32, 1, 4, 2), Blocks(32, 32, 16, 1, 4, 2),
                     Blocks(32, 16, 16, 1, 4, 2), Blocks(16, 16, 16, 1, 4, 2)]


def refusing(limit: int, shared: Callable[[Blocks], int], ran: list[Blocks]) -> Callable[[Blocks], Blocks]:
    """A launch that raises OutOfResources, as Triton does, for blocks needing more than `limit`."""
    def run(blocks: Blocks) -> Blocks:
        ran.append(blocks)
        if shared(blocks) > limit:
            raise OutOfResources(shared(blocks), limit, "shared memory")
        return blocks
    return run


def test_a_launch_the_card_refuses_runs_the_first_smaller_blocks_it_takes_and_later_calls_run_them_at_once(fitted):
    wanted = Blocks(64, 64, 128, 1)
    steps = [wanted, Blocks(64, 64, 128, 1, stages=2), Blocks(64, 64, 64, 1, stages=2)]
    shared = dict(zip(steps, (114688, 114688, 65536))).__getitem__
    ran: list[Blocks] = []
    assert launch_fitted("card", wanted, refusing(SM89_SHARED, shared, ran)) == steps[-1]
    assert ran == steps and fitted == {("card", wanted): steps[-1]}
    ran.clear()
    assert launch_fitted("card", wanted, refusing(SM89_SHARED, shared, ran)) == steps[-1]
    assert ran == [steps[-1]]  # remembered: no refused launch again, none inside a graph's capture
    assert launch_fitted("another card", wanted, refusing(SM90_SHARED, shared, ran)) == wanted


def test_blocks_no_card_takes_raise_the_cards_refusal(fitted):
    def run(blocks: Blocks) -> None:
        raise OutOfResources(1 << 20, SM89_SHARED, "shared memory")

    with pytest.raises(OutOfResources):
        launch_fitted("card", Blocks(16, 16, 16, 1, stages=2), run)
    assert fitted == {}


@cache
def compiled_shared(blocks: Blocks, arch: int, tiles: tuple[int, int]) -> int:
    """The shared memory the kernel needs with `blocks`, compiled for sm_`arch` here."""
    return compiled(blocks, arch, tiles).metadata.shared


@pytest.mark.parametrize("tiles", [CUDA_TILES, WORDS])  # a draft's Int4Linear's tiles; gemm_words'
@pytest.mark.parametrize("rows", [32, 256])
def test_blocks_for_fitted_to_an_rtx_4090_need_no_more_shared_memory_than_it_has(rows, tiles):
    """blocks_for's blocks were set on an H200 (227 KiB of shared memory a block): compiled for an
    RTX 4090 on torch's tiles they need more than its 99 KiB (Triton 3.9 here: 104 KiB at 32 rows,
    112 KiB at 64 and more), so the kernel's probe over 17-256 rows raised there as a 4-bit draft
    loaded. Fitted, they fit."""
    def shared(blocks: Blocks) -> int:
        return compiled_shared(blocks, 89, tiles)

    blocks = launch_fitted(("sm_89", tiles), blocks_for(rows), refusing(SM89_SHARED, shared, []))
    assert shared(blocks) <= SM89_SHARED
    if tiles == CUDA_TILES:
        assert shared(blocks_for(rows)) > SM89_SHARED and blocks != blocks_for(rows)


@pytest.mark.parametrize(("rows", "swept"), [(1, Blocks(16, 32, 128, 1)), (16, Blocks(16, 32, 128, 1)),
                                             (17, Blocks(32, 64, 128, 1)), (32, Blocks(32, 64, 128, 1)),
                                             (33, Blocks(64, 64, 128, 1)), (256, Blocks(64, 64, 128, 1))])
def test_blocks_for_gives_the_blocks_the_h200_sweep_ran_fastest(rows, swept):
    """16 x 32 x 128 up to 16 rows, 64 outputs by 128 inputs past them on the fewest row blocks
    covering the rows, none split (docs/benchmarks.md, `gpu_check.sh --scale --parts gemm`)."""
    assert blocks_for(rows) == swept


def test_on_an_h200_blocks_for_runs_as_swept():
    def shared(blocks: Blocks) -> int:
        return compiled_shared(blocks, 90, CUDA_TILES)

    assert launch_fitted("sm_90", blocks_for(256), refusing(SM90_SHARED, shared, [])) == blocks_for(256)


def test_the_kernel_steps_down_where_the_card_refuses_and_gives_the_same_product(monkeypatch):
    """int4_gemm's launch fits blocks_for's blocks, under the interpreter as on a card: a launch
    refused (stood in for) reruns with smaller blocks: fewer stages, the same product."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from specchat.quant import int4_gemm

    real = int4_gemm.run_kernel
    refused: list[Blocks] = []

    def with_small_shared_memory(x, weight, layout, scales_and_zeros, group_size, out_features, blocks):
        if blocks.stages > 2:
            refused.append(blocks)
            raise OutOfResources(114688, SM89_SHARED, "shared memory")
        return real(x, weight, layout, scales_and_zeros, group_size, out_features, blocks)

    generator = torch.Generator().manual_seed(0)
    words = torch.randint(-2**31, 2**31 - 1, (128 // 8, 64), dtype=torch.int32, generator=generator)
    pairs = (torch.rand(1, 64, 2, generator=generator) / 16).to(torch.bfloat16)
    x = torch.randn(24, 128, generator=generator).to(torch.bfloat16)  # blocks_for(24) is not blocks_for(128)
    monkeypatch.setattr(int4_gemm, "run_kernel", with_small_shared_memory)
    stepped = int4_gemm.w4a16_linear(x, words, pairs, 128)
    assert refused == [blocks_for(24)]  # the blocks for the product's rows
    assert gemm_blocks.FITTED == {((x.device, x.dtype, None), blocks_for(24)): Blocks(32, 64, 128, 1, stages=2)}
    assert torch.equal(stepped, real(x, words, None, pairs, 128, 64, blocks_for(24)))
    with pytest.raises(OutOfResources):  # blocks given (a sweep's) run as given
        int4_gemm.w4a16_linear(x, words, pairs, 128, blocks_for(24))
