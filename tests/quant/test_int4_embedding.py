"""Int4Embedding: a lookup expands only the rows it reads, to the rows of the dense weight."""

import pytest
import torch
from helpers.int4_weights import random_weight

from specchat.quant.int4_checkpoint import int4_entries
from specchat.quant.int4_embedding import Int4Embedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_its_buffers_take_a_checkpoints_entries_and_a_lookup_gives_the_dense_rows(dtype):
    weight = random_weight(96, 64, seed=4)  # 2 groups of 32 inputs
    embedding = Int4Embedding(96, 64, 2, dtype)
    entries = int4_entries("embed", weight)
    # strict, and shapes checked: the skeleton's buffers are those a checkpoint stores
    embedding.load_state_dict({name.removeprefix("embed."): tensor for name, tensor in entries.items()})
    ids = torch.tensor([[0, 95, 7], [7, 31, 2]])
    assert torch.equal(embedding(ids), weight.dequantize()[ids].to(dtype))
    assert repr(embedding) == "Int4Embedding(96, 64, 4-bit)"
