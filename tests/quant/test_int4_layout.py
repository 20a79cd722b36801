"""int4_pack and int4_layout: canonical nibbles, packing in chunks, and the kernel layout learned
from torch's own converter and read back."""

import pytest
import torch
from helpers.int4_layouts import pack_by_spec, scrambled_layout

from specchat.errors import SpecchatError
from specchat.quant import int4_layout
from specchat.quant.int4_layout import fit_tiles, layout_of, unpack_transposed
from specchat.quant.int4_pack import (PACK_ROWS, check_shape, inner_k_tiles, nibbles_by_rows, pack, pack_nibbles,
                                      packed_shape, unpack_nibbles)

CPU = torch.device("cpu")


def random_q(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_canonical_nibbles_hold_even_inputs_high():
    q = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    assert pack_nibbles(q).tolist() == [[0x12, 0x34]]
    q = random_q(32, 64)
    assert torch.equal(unpack_nibbles(pack_nibbles(q)), q)


def test_nibbles_made_by_rows_are_the_whole_weights_nibbles():
    """A checkpoint's values asked PACK_ROWS outputs at a time, the last chunk partial."""
    q = random_q(PACK_ROWS + 96, 64)
    asked = []
    nibbles = nibbles_by_rows(PACK_ROWS + 96, lambda start, stop: asked.append((start, stop)) or q[start:stop])
    assert asked == [(0, PACK_ROWS), (PACK_ROWS, PACK_ROWS + 96)]
    assert torch.equal(nibbles, pack_nibbles(q))


def test_a_shape_the_kernels_cannot_take_is_refused_with_what_they_need():
    check_shape(256, 128, 32)
    with pytest.raises(SpecchatError) as refused:
        check_shape(100, 128, 32)
    assert str(refused.value) == ("int4 kernels need groups of 32, 64, 128, 256 inputs dividing in_features and "
                                  "out_features divisible by 16; got 100 x 128 in groups of 32")


def test_packing_in_chunks_is_the_whole_conversion():
    q = random_q(PACK_ROWS + 96, 64)
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    assert torch.equal(pack(pack_nibbles(q), CPU), whole)


def test_the_learned_cpu_layout_reads_packed_weights_back():
    layout = layout_of("cpu", 1)
    assert layout is not None and layout.cols == 1 and layout.rows in (32, 64)  # x86: AVX2, AVX512
    q = random_q(8 * layout.rows, 96, seed=1)
    packed = pack(pack_nibbles(q), CPU)
    rows = 2 * layout.rows
    out = torch.empty(96, rows)
    unpack_transposed(packed, 3 * layout.rows, layout, torch.empty(2 * rows * 96, dtype=torch.uint8), out)
    assert torch.equal(out, q[3 * layout.rows:5 * layout.rows].t().float())


def test_fitting_finds_a_made_up_layout_and_rejects_a_wrong_tile():
    # 4 x 2 tiles, row-major, each tile's weights stored in reverse order
    rows, cols, tile_rows, tile_cols = 8, 4, 4, 2
    stream = [(tr * tile_rows + r) * cols + tc * tile_cols + c
              for tr in range(rows // tile_rows) for tc in range(cols // tile_cols)
              for r, c in reversed([(r, c) for r in range(tile_rows) for c in range(tile_cols)])]
    natural = fit_tiles(torch.tensor(stream), cols, tile_rows, tile_cols)
    size = tile_rows * tile_cols
    reversed_order = torch.arange(size - 1, -1, -1)  # weight w sits at stream place size - 1 - w
    plane = reversed_order % 2 * (size // 2) + reversed_order // 2
    assert torch.equal(natural, plane)
    assert fit_tiles(torch.tensor(stream), cols, 2, 2) is None


def learn_with_stand_in(monkeypatch: pytest.MonkeyPatch, made_up, device_type: str, tiles: int):
    """layout_of(device_type, tiles) with torch's converter replaced by one that packs by the
    written-out spec (helpers/int4_layouts) in `made_up`'s tiles."""
    def stand_in(nibbles: torch.Tensor, device: torch.device, _tiles: int) -> torch.Tensor:
        return pack_by_spec(unpack_nibbles(nibbles).long(), made_up)

    monkeypatch.setattr(int4_layout, "convert", stand_in)
    layout_of.cache_clear()
    try:
        return layout_of(device_type, tiles)
    finally:
        layout_of.cache_clear()  # the real converters' layouts are learned afresh where next asked


@pytest.mark.parametrize("device_type, tiles, tile_rows, tile_cols", [
    ("cpu", 1, 8, 4),  # the CPU's probe of 512 x 8 weights: the order read back whole
    ("meta", 2, 8, 32), ("meta", 4, 8, 64), ("meta", 8, 8, 128),  # CUDA's probe and 8 x 16 t tiles
])
def test_a_converters_tiles_are_learned_from_the_bytes_it_makes(device_type, tiles, tile_rows, tile_cols,
                                                                monkeypatch):
    """The learning step on a converter of known layout, tiles in a seeded scrambled order: the tile
    and its order. CUDA's shapes are learned on the meta device (no GPU here), where the order is not
    read back but the tile and the order flag are."""
    made_up = scrambled_layout(tile_rows, tile_cols, seed=tiles)
    layout = learn_with_stand_in(monkeypatch, made_up, device_type, tiles)
    assert (layout.rows, layout.cols, layout.in_order) == (tile_rows, tile_cols, False)
    if device_type == "cpu":
        assert torch.equal(layout.natural, made_up.natural)


def test_a_converter_in_plain_row_order_has_tiles_of_one_byte_in_order(monkeypatch):
    """Weights stored row by row, two a byte (the even one low): one-row tiles fit at every width,
    down to one weight, but a tile is whole bytes, so the layout is 1 x 2 in order, not 1 x 1."""
    row_order = int4_layout.TileLayout(1, 2, torch.arange(2), in_order=True)
    layout = learn_with_stand_in(monkeypatch, row_order, "cpu", 1)
    assert (layout.rows, layout.cols, layout.in_order) == (1, 2, True)
    assert torch.equal(layout.natural, torch.arange(2))


def test_a_converter_whose_bytes_are_no_grid_of_tiles_has_no_layout(monkeypatch):
    """One order over the whole probe (no tile repeats): None, and wide inputs keep the fused kernel."""
    assert learn_with_stand_in(monkeypatch, scrambled_layout(512, 8, seed=0), "cpu", 1) is None


def test_cuda_takes_the_most_inner_k_tiles_the_width_allows():
    """Worked out on the CPU: CUDA's converter takes t = 2, 4 or 8 inner k-tiles where I % (16 t)
    == 0 and lays [O, I] out as int32 [O / 8, I / (16 t), 32, t / 2]; the CPU's converter ignores t."""
    assert [inner_k_tiles(width, "cuda") for width in (8192, 128, 64, 96, 32)] == [8, 8, 4, 2, 2]
    assert inner_k_tiles(96, "cpu") == 1
    assert packed_shape(256, 8192, "cuda") == ((32, 64, 32, 4), torch.int32)
    assert packed_shape(256, 96, "cuda") == ((32, 3, 32, 1), torch.int32)
    assert packed_shape(256, 96, "cpu") == ((256, 48), torch.uint8)
    with pytest.raises(SpecchatError, match="divisible by 32; got 48"):
        inner_k_tiles(48, "cuda")


def test_packing_refuses_shapes_the_kernels_cannot_take():
    from specchat.quant.int4_pack import check_shape
    with pytest.raises(SpecchatError, match="groups of 32"):
        check_shape(64, 64, 16)
    with pytest.raises(SpecchatError, match="divisible by 16"):
        check_shape(40, 64, 32)


def test_the_layout_key_names_what_the_cpu_layout_depends_on(monkeypatch):
    """A layer file's fingerprint holds the key: a layout packed by another torch, or for another
    vector width, must not be read back. The expected keys are written out, so that a change of
    format (which makes every stored layer file stale) shows here."""
    from specchat.quant.int4_pack import layout_key
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert layout_key("cpu") == "cpu, torch 2.13.0, AVX512"
    assert layout_key("cuda") == "cuda, torch 2.13.0"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # 32-row blocks, not 64
    assert layout_key("cpu") == "cpu, torch 2.13.0, AVX2"
    assert layout_key("cuda") == "cuda, torch 2.13.0"  # the CUDA layout does not follow the host's CPU
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    assert (layout_key("cpu"), layout_key("cuda")) == ("cpu, torch 2.14.0, AVX2", "cuda, torch 2.14.0")
