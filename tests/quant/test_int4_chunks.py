"""The chunked int4 product's chunks (quant/int4_chunks.py): whole tiles of about CHUNK_WEIGHTS
weights, a weight in several of them expanded whole, and the workspace the plan counts for them,
which is what a call allocates beside its output where a chunk is whole tiles. Its products against
a dense reference are tested in test_int4.py."""

import pytest
import torch
from helpers.allocations import record_allocations
from helpers.int4_weights import GROUP, IN, random_weight

from specchat.quant import int4_chunks
from specchat.quant.int4 import int4_tensors
from specchat.quant.int4_chunks import chunk_rows, chunked_linear, chunked_workspace, dequantized
from specchat.quant.int4_layout import layout_for

CPU = torch.device("cpu")


@pytest.mark.parametrize("in_features, out_features, tile_rows, rows", [
    (1024, 4096, 8, 1024),  # 1 Mi weights: 1024 rows of 1024
    (1000, 4096, 64, 1024),  # 1048 rows' worth, rounded down to whole 64-row tiles
    (1024, 96, 8, 96),  # the weight's own rows, where they are fewer
    (32768, 4096, 64, 64),  # a row longer than a chunk: one tile
])
def test_a_chunk_is_whole_tiles_of_about_a_mebiweight(in_features, out_features, tile_rows, rows):
    assert chunk_rows(in_features, out_features, tile_rows) == rows


def test_a_weight_in_several_chunks_the_last_one_short_is_expanded_whole(monkeypatch):
    """Chunks of three of this CPU's tiles over ten: each chunk's rows land in their own columns of
    the product and rows of the dense copy, the last chunk's too."""
    weight = random_weight(out_features=640)
    layout = layout_for(CPU, IN)
    assert 640 % layout.rows == 0
    monkeypatch.setattr(int4_chunks, "CHUNK_WEIGHTS", IN * 3 * layout.rows)
    assert chunk_rows(IN, 640, layout.rows) == 3 * layout.rows < 640
    tensors = int4_tensors(weight, None, torch.float32, CPU)
    packed, scales_and_zeros = tensors["packed"], tensors["scales_and_zeros"]
    expected = weight.dequantize()
    assert torch.equal(chunked_linear(torch.eye(IN), packed, scales_and_zeros, GROUP, layout, torch.float32).t(),
                       expected)
    assert torch.equal(dequantized(packed, scales_and_zeros, GROUP, layout, torch.float32), expected)


@pytest.mark.parametrize("dtype, product", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
                                            (torch.float32, torch.float32)])
@pytest.mark.parametrize("in_features, out_features", [(1024, 2048), (32768, 128)])
def test_the_workspace_is_what_a_call_allocates_beside_its_output(monkeypatch, dtype, product, in_features,
                                                                  out_features):
    """1024 inputs: a chunk of 1024 rows, whole tiles of any layout, so the bound is exact; 32768: a
    row longer than a chunk, so a chunk is one tile of this CPU's layout, at most the tallest any
    layout has, which the bound is sized for. Counted from the buffers' own sizes, a stand-in for
    torch.empty and torch.empty_like recording every allocation; the input converted to `product`
    is one too."""
    rows = 5
    tensors = int4_tensors(random_weight(out_features, in_features), None, dtype, CPU)
    layout = layout_for(CPU, in_features)
    x = torch.randn(rows, in_features).to(dtype)
    sizes = record_allocations(monkeypatch, ("empty", "empty_like"))
    out = chunked_linear(x, tensors["packed"], tensors["scales_and_zeros"], 32, layout, product)
    monkeypatch.undo()
    converted = 0 if product == dtype else x.to(product).nbytes
    allocated = sum(sizes) - out.nbytes + converted
    bound = chunked_workspace(in_features, out_features, rows, dtype, product, 32)
    assert allocated == bound if in_features == 1024 else allocated <= bound
