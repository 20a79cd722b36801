"""checkpoint/layout.py: a decoder layer's tensors in one byte buffer, a MoE layer's head first and
each expert in an aligned unit of its own; the tensors copied in and read back as views."""

import pytest
import torch
from helpers.layer_specs import SPECS, UNIT_OF, tensors
from torch import nn

from specchat.checkpoint.layout import align, expert_units, lay_out, layout_of, pack_into
from specchat.offload.direct_io import ALIGN
from specchat.quant.split_experts import SplitExperts


def test_a_moe_layout_puts_the_head_first_and_each_expert_in_an_aligned_unit_of_its_own():
    layout = lay_out(SPECS, UNIT_OF)
    offsets = {p.name: p.offset for p in layout.places}
    # head: q (60 bytes) at 0, norm at the next 64-byte boundary; then the units on 4096 boundaries
    assert offsets["attn.q"] == 0 and offsets["norm"] == 64
    assert layout.units == ((ALIGN, ALIGN + 64 + 4), (2 * ALIGN, 2 * ALIGN + 448 + 8))
    assert (offsets["experts.0.w"], offsets["experts.0.b"]) == (ALIGN, ALIGN + 64)
    assert (offsets["experts.1.w"], offsets["experts.1.b"]) == (2 * ALIGN, 2 * ALIGN + 448)
    assert layout.head == ALIGN and layout.nbytes == 2 * ALIGN + 456


def test_a_dense_layout_is_all_head():
    layout = lay_out(SPECS)
    assert layout.units == () and layout.head == layout.nbytes == max(p.offset + p.nbytes for p in layout.places)
    # one after another in the order given, each on a 64-byte boundary: 60, 28, 12, 400, 8 and 4 bytes
    assert [p.offset for p in layout.places] == [0, 64, 128, 192, 640, 704] and layout.nbytes == 708


def test_offsets_round_up_to_the_boundary_and_stay_on_it():
    assert [align(offset, 64) for offset in (0, 1, 63, 64, 65, 128)] == [0, 64, 64, 64, 128, 128]


def test_packed_tensors_are_read_back_as_views_of_the_buffer_in_the_layouts_dtypes():
    specs = [*SPECS, ("norm.half", torch.bfloat16, (2, 2))]
    layout = lay_out(specs, UNIT_OF)
    buffer = torch.full((layout.nbytes,), 255, dtype=torch.uint8)
    given = tensors() | {"norm.half": torch.tensor([1.5, -2.0, 3.25, 0.0])}  # float32, flat: cast and shaped
    pack_into(layout, given, buffer)
    views = layout.views(buffer)
    assert set(views) == {name for name, _, _ in specs}
    for name, dtype, shape in specs:
        assert views[name].dtype == dtype and views[name].shape == shape
        assert torch.equal(views[name], given[name].to(dtype).reshape(shape))
    views["norm"].fill_(-1.0)  # a view writes the buffer: the layer's tensors are its bytes
    assert torch.equal(layout.views(buffer)["norm"], torch.full((3,), -1.0))


def test_a_layer_missing_a_tensor_is_not_packed():
    layout = lay_out(SPECS)
    given = tensors()
    del given["norm"], given["experts.1.b"]
    with pytest.raises(KeyError, match=r"\['experts.1.b', 'norm'\]"):
        pack_into(layout, given, torch.zeros(layout.nbytes, dtype=torch.uint8))


def test_a_layers_split_experts_are_its_units_each_by_its_number():
    layer = nn.Module()
    layer.norm = nn.LayerNorm(4)
    layer.mlp = nn.Module()
    layer.mlp.experts = SplitExperts(3, 4, 6, nn.SiLU())
    units = expert_units(layer)
    assert units == {f"mlp.experts.{e}.{linear}.weight": e for e in range(3)
                     for linear in ("gate_proj", "up_proj", "down_proj")}
    layout = layout_of(layer)
    assert len(layout.units) == 3 and all(start % ALIGN == 0 for start, _ in layout.units)
    assert {p.name for p in layout.places} == set(layer.state_dict())
    head = [p for p in layout.places if p.name not in units]
    assert all(p.offset + p.nbytes <= layout.head for p in head)  # the norm moves with the head
