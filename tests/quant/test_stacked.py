"""Stacked projections (quant/stacked.py): one product for the linears that read the same input,
whatever order the parts are called in, and a draft model that computes what it computed before."""

import pytest
import torch
from helpers.tiny import build_tiny
from torch import nn

from specchat.decoding.kvcache import new_cache
from specchat.quant import stacked
from specchat.quant.int4 import Int4Linear, int4_linear
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.int8 import Int8Linear, quantize_linears
from specchat.quant.stacked import Part, Stack, stack_projections

CPU = torch.device("cpu")


def linears(seed: int, widths: list[int], bias: list[bool], in_features: int = 12) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(in_features, width, bias=b).double() for width, b in zip(widths, bias)]


@pytest.mark.parametrize("bias", [[True, False, True], [True, True, True], [False, False, False]])
def test_parts_give_each_linear_its_output_in_any_order_from_one_product_and_then_let_go(bias):
    """Biases drawn nonzero (a model's are initialised to zero, which would hide a lost one); a stack
    of unbiased linears adds none."""
    separate = linears(0, [8, 4, 4], bias)
    for linear in separate:
        if linear.bias is not None:
            nn.init.normal_(linear.bias)
    stack = Stack(separate)
    assert (stack.linear.bias is None) == (not any(bias))
    products = []
    stack.linear.register_forward_hook(lambda module, args, out: products.append(out))
    parts = [Part(stack, index) for index in range(3)]
    x, y = torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(3, 12, dtype=torch.float64)
    for order, calls in (([0, 1, 2], 1), ([2, 0, 1], 1), ([1, 1, 0, 2], 2)):  # a part called twice: a new product
        products.clear()
        for index in order:
            assert torch.allclose(parts[index](x), separate[index](x), rtol=0, atol=1e-12)
        assert len(products) == calls
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


def int4_linears(outs: list[int], in_features: int = 128, group_size: int = 32, perms: list[bool] | None = None,
                 kernel: torch.device = CPU, biased: bool = False) -> list[Int4Linear]:
    """CPU-packed Int4Linears of random weights (float32), with a random act-order where `perms` says
    and (`biased`) random biases."""
    generator = torch.Generator().manual_seed(sum(outs))
    made = []
    for index, out in enumerate(outs):
        nibbles = torch.randint(0, 256, (out, in_features // 2), dtype=torch.uint8, generator=generator)
        scales = torch.rand(in_features // group_size, out, generator=generator) / 16
        zeros = torch.randn(in_features // group_size, out, generator=generator) / 16
        perm = torch.randperm(in_features, generator=generator) if perms and perms[index] else None
        bias = torch.randn(out, generator=generator) if biased else None
        made.append(int4_linear(Int4Weight(nibbles, scales, zeros, perm), bias, torch.float32, kernel))
    return made


def holding(linears: list[nn.Module]) -> nn.Module:
    holder = nn.Module()
    holder.q_proj, holder.k_proj, holder.v_proj = linears
    return holder


def packed_stacks(linears: list[Int4Linear]) -> int:
    return stack_projections(holding(linears), packed=True)


@pytest.mark.parametrize("biased", [False, True], ids=["unbiased", "biased"])  # Qwen2's q, k and v have biases
def test_stacked_int4_linears_give_each_its_product_bit_for_bit(biased):
    """The fused kernel computes an output from its own column of the packed weight: laid end to end,
    each part's columns are its own linear's, so its product is too."""
    separate = int4_linears([128, 64, 64], biased=biased)
    holder = holding(separate)
    assert stack_projections(holder) == 0  # packed linears only when asked (a CUDA draft's)
    assert stack_projections(holder, packed=True) == 1 and isinstance(holder.q_k_v_stack.linear, Int4Linear)
    assert holder.q_k_v_stack.linear.out_features == 256
    for rows in (1, 5):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
        for name, linear in zip(("q_proj", "k_proj", "v_proj"), separate):
            assert torch.equal(getattr(holder, name)(x), linear(x))


def test_int4_linears_of_another_packing_or_of_an_unread_layout_stay_apart(monkeypatch):
    assert packed_stacks(int4_linears([64, 64, 64], perms=[True, False, False])) == 0  # input orders
    assert packed_stacks(int4_linears([64, 64, 64], perms=[True, True, True])) == 0  # drawn apart
    mixed = int4_linears([64, 64]) + int4_linears([64], group_size=64)
    assert packed_stacks(mixed) == 0  # groups of 32 and 64
    with monkeypatch.context() as patch:
        patch.setattr(stacked, "layout_for", lambda *where: None)  # a CPU layout int4_layout cannot read
        assert packed_stacks(int4_linears([64, 64, 64])) == 0
    ordered = int4_linears([64, 64, 64], perms=[True, True, True])
    for linear in ordered[1:]:
        linear.perm = ordered[0].perm  # one input order (GPTQ's from one input): stacked, products kept
    holder = holding(ordered)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    expected = [linear(x) for linear in ordered]
    assert stack_projections(holder, packed=True) == 1
    assert all(torch.equal(holder.get_submodule(name)(x), want) for name, want in zip(("q_proj", "k_proj", "v_proj"),
                                                                                       expected))


def test_cuda_packed_int4_linears_lay_their_tiles_and_scales_end_to_end():
    """CUDA's packed int4 is [O/8, I/16t, 32, t/2]: a part's 8-row tiles follow the one before's;
    the buffers here are filled on the CPU, where nothing multiplies them."""
    cuda = torch.device("cuda")
    parts = [Int4Linear(256, out, 32, False, False, torch.bfloat16, cuda) for out in (128, 64, 64)]
    generator = torch.Generator().manual_seed(0)
    for linear in parts:
        linear.packed = torch.randint(-2**31, 2**31 - 1, linear.packed.shape, dtype=torch.int32, generator=generator)
        linear.scales_and_zeros = torch.randn(linear.scales_and_zeros.shape, generator=generator).to(torch.bfloat16)
        linear.registers = True
    holder = holding(parts)
    assert stack_projections(holder, packed=True) == 1
    one = holder.q_k_v_stack.linear
    assert one.kernel == "cuda" and one.registers and one.out_features == 256
    assert torch.equal(one.packed, torch.cat([linear.packed for linear in parts]))
    assert torch.equal(one.scales_and_zeros[:, 128:192], parts[1].scales_and_zeros)
