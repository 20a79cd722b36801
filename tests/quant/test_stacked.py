"""Stacked projections (quant/stacked.py): one product for the linears that read the same input,
whatever order the parts are called in, and a draft model that computes what it computed before."""

import torch
from helpers.tiny import build_tiny
from torch import nn

from specchat.decoding.kvcache import new_cache
from specchat.quant.int8 import Int8Linear, quantize_linears
from specchat.quant.stacked import Part, Stack, stack_projections


def linears(seed: int, widths: list[int], bias: list[bool], in_features: int = 12) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(in_features, width, bias=b).double() for width, b in zip(widths, bias)]


def test_parts_give_each_linear_its_output_in_any_order_and_then_let_go():
    separate = linears(0, [8, 4, 4], [True, False, True])
    stack = Stack(separate)
    parts = [Part(stack, index) for index in range(3)]
    x, y = torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(3, 12, dtype=torch.float64)
    for order in ([0, 1, 2], [2, 0, 1], [1, 1, 0, 2]):
        for index in order:
            assert torch.allclose(parts[index](x), separate[index](x), rtol=0, atol=1e-12)
        assert stack.input is None and stack.output is None  # nothing held once every part has taken its columns
    # interleaved inputs: each part still answers for the input it was given
    assert torch.allclose(parts[0](x), separate[0](x), rtol=0, atol=1e-12)
    assert torch.allclose(parts[1](y), separate[1](y), rtol=0, atol=1e-12)
    assert torch.allclose(parts[2](x), separate[2](x), rtol=0, atol=1e-12)


def test_a_stacked_tiny_model_computes_what_it_did_with_its_cache():
    lm = build_tiny(0)
    tokens = torch.arange(12) % 50
    before = [lm.model(tokens[None]).logits]
    cache = new_cache()
    before.append(lm.logits(lm.hidden(tokens[:7], torch.arange(7), cache)))
    before.append(lm.logits(lm.hidden(tokens[7:], torch.arange(7, 12), cache)))
    assert stack_projections(lm.model.get_decoder()) == 2 * lm.model.config.num_hidden_layers
    attention = lm.model.model.layers[0].self_attn
    assert all(isinstance(getattr(attention, name), Part) for name in ("q_proj", "k_proj", "v_proj"))
    cache = new_cache()
    after = [lm.model(tokens[None]).logits, lm.logits(lm.hidden(tokens[:7], torch.arange(7), cache)),
             lm.logits(lm.hidden(tokens[7:], torch.arange(7, 12), cache))]
    for old, new in zip(before, after):
        assert torch.allclose(old, new, rtol=0, atol=1e-10)


def test_stacks_quantize_like_the_linears_they_replace():
    """quantize_linears reaches the stacked linear; per-row int8 scales make its rows those of
    the separate int8 linears."""
    separate = linears(1, [8, 4], [False, False])
    holder = nn.Module()
    holder.gate_proj, holder.up_proj = separate
    stack_projections(holder)
    assert quantize_linears(holder) == 1 and isinstance(holder.gate_up_stack.linear, Int8Linear)
    rows = holder.gate_up_stack.linear.int8_rows()
    expected = torch.cat([Int8Linear(linear.weight.float(), None).int8_rows() for linear in separate])
    assert torch.equal(rows, expected)


def test_groups_of_other_widths_or_kinds_are_left_alone():
    holder = nn.Module()
    holder.q_proj, holder.k_proj = linears(2, [4, 4], [False, False])
    holder.v_proj = nn.Linear(6, 4)  # another input width
    holder.gate_proj = nn.Linear(12, 4)
    holder.up_proj = Int8Linear(torch.randn(4, 16), None)  # not a plain nn.Linear
    assert stack_projections(holder) == 0
    assert type(holder.q_proj) is nn.Linear and type(holder.gate_proj) is nn.Linear
