"""Int4Weight.dequantize, computed a piece of rows at a time: every row is (q - 8) * scale + zero of
its own group, rounded once, and act-order's inputs go back to the layer's order."""

import pytest
import torch
from helpers.int4_weights import GROUP, IN, random_weight

from specchat.quant.int4_pack import unpack_nibbles
from specchat.quant.int4_weight import ROWS_A_PIECE, Int4Weight


def formula(weight: Int4Weight) -> torch.Tensor:
    """w[o, i] = (q[o, i] - 8) * scale[i // g, o] + zero[i // g, o] in float64, rounded once to float32."""
    q = unpack_nibbles(weight.nibbles).double() - 8
    groups = torch.arange(weight.in_features) // weight.group_size
    return (q * weight.scales.double()[groups].t() + weight.zeros.double()[groups].t()).float()


@pytest.mark.parametrize("rows", [1, ROWS_A_PIECE, 2 * ROWS_A_PIECE + 44])
def test_every_piece_of_rows_dequantizes_to_the_formula(rows):
    weight = random_weight(out_features=rows)
    assert weight.group_size == GROUP
    assert torch.equal(weight.dequantize(), formula(weight))


def test_act_orders_inputs_go_back_to_the_layers_order():
    weight = random_weight(out_features=ROWS_A_PIECE + 3, act_order=True)
    stored = formula(weight)
    dequantized = weight.dequantize()
    for column in (0, 1, IN // 2, IN - 1):
        assert torch.equal(dequantized[:, weight.perm[column]], stored[:, column])
