"""GPTQ through the packed int4 path: the converter reproduces gptq.dequantize's weights exactly
(float32), and a GPTQ model built by the skeleton with a kernel device holds Int4Linears whose
logits match the dequantized model, through the fused kernel and the chunked product alike."""

from pathlib import Path

import pytest
import torch
from helpers.gptq_writer import dequantized_linears, load_checkpoint, pack_gptq, quantize_rtn, write_gptq_checkpoint
from helpers.tiny import tiny_qwen_config
from torch import nn
from transformers import AutoConfig, Qwen2ForCausalLM

from specchat.checkpoint.skeleton import build_skeleton
from specchat.checkpoint.sources import SafetensorsSource
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.errors import SpecchatError
from specchat.quant.gptq import GPTQLinear, GPTQSpec, dequantize
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_gptq import gptq_int4_tensors, gptq_to_int4, replace_linears_with_gptq_int4, spec_group_size
from specchat.quant.int4_pack import PACK_ROWS
from specchat.quant.widths import UNLIMITED, WidthChoice

CPU = torch.device("cpu")
PROMPT = torch.tensor([3, 14, 15, 9, 26, 5])


@pytest.mark.parametrize("spec", [GPTQSpec(group_size=128), GPTQSpec(group_size=128, sym=False, desc_act=True),
                                  GPTQSpec(group_size=32, sym=False, desc_act=True), GPTQSpec(group_size=-1),
                                  GPTQSpec(group_size=512, sym=False)],
                         ids=["g128-sym", "g128-asym-act-order", "g32-asym-act-order", "g-1", "g512"])
@pytest.mark.parametrize("outputs", [96, PACK_ROWS + 96])  # past PACK_ROWS: converted in chunks, the last partial
def test_the_converted_weight_is_gptqs_exactly(spec, outputs):
    weight = torch.randn(outputs, 1024, generator=torch.Generator().manual_seed(3))
    tensors = pack_gptq(quantize_rtn(weight, spec.group_size, spec.sym, spec.desc_act), None)
    reference = dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], torch.float32)
    group_size = spec_group_size(spec, 1024)
    converted = gptq_to_int4(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], group_size)
    assert torch.equal(converted.dequantize(), reference)
    assert (converted.perm is not None) == spec.desc_act
    assert group_size == min(256, 1024 if spec.group_size == -1 else spec.group_size)


def test_groups_the_kernel_groups_do_not_divide_are_refused():
    tensors = pack_gptq(quantize_rtn(torch.randn(32, 256), 128, True, False), None)
    g_idx = tensors["g_idx"].clone()
    g_idx[:8] = 1  # group 0 now holds 120 inputs
    with pytest.raises(SpecchatError, match="not multiples"):
        gptq_to_int4(tensors["qweight"], tensors["qzeros"], tensors["scales"], g_idx, 128)


@pytest.mark.parametrize("act_order", [False, True])
def test_a_modules_tensors_fill_exactly_its_linears_buffers_even_with_g_idx_in_input_order(act_order):
    """An act-order checkpoint whose g_idx happens to be sorted converts without a permutation; its
    linear still reads one (the identity), and a linear without act order gets none."""
    generator = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(64, 128, generator=generator), torch.randn(64, generator=generator)
    tensors = pack_gptq(quantize_rtn(weight, 32, False, False), bias)
    linear = Int4Linear(128, 64, 32, True, act_order, torch.float32, CPU)
    buffers = gptq_int4_tensors(tensors.__getitem__, linear)
    assert buffers.keys() == linear.state_dict().keys()
    linear.load_state_dict(buffers)
    assert not act_order or torch.equal(linear.perm, torch.arange(128))


@pytest.fixture(scope="module")
def gptq_dir(tmp_path_factory) -> Path:
    torch.manual_seed(7)
    config = tiny_qwen_config(vocab_size=96, hidden_size=128, intermediate_size=256, max_position_embeddings=128,
                              tie_word_embeddings=False)
    spec = GPTQSpec(group_size=32, desc_act=True, sym=False)
    return write_gptq_checkpoint(Qwen2ForCausalLM(config).eval(), tmp_path_factory.mktemp("gptq"), spec)


def logits(model: nn.Module) -> torch.Tensor:
    lm = CausalLM(model)
    return lm.logits(lm.hidden(PROMPT, torch.arange(PROMPT.numel()), new_cache()))


@pytest.mark.parametrize("fused_rows", [UNLIMITED, 0], ids=["fused", "chunked"])
def test_a_gptq_model_runs_packed_through_the_kernel_entry_points(gptq_dir, fused_rows):
    model = load_checkpoint(gptq_dir, CPU)
    linears = [module for module in model.modules() if isinstance(module, Int4Linear)]
    assert len(linears) == 2 * 7 and not any(isinstance(m, GPTQLinear) for m in model.modules())
    assert linears[0].packed.dtype == torch.uint8 and not linears[0].packed.is_meta
    for linear in linears:
        linear.widths = WidthChoice(fused_rows, torch.float32)
    reference = logits(dequantized_linears(load_checkpoint(gptq_dir, None)))
    # the same weights, summed in another order: float32 rounding only (measured 4e-7 on logits of 0.64)
    torch.testing.assert_close(logits(model), reference, atol=2e-5, rtol=0)


def test_without_a_kernel_device_the_skeleton_keeps_gptq_linears(gptq_dir):
    model = build_skeleton(AutoConfig.from_pretrained(gptq_dir), SafetensorsSource(gptq_dir), torch.float32)
    assert not any(isinstance(m, Int4Linear) for m in model.modules())
    assert sum(isinstance(m, GPTQLinear) for m in model.modules()) == 2 * 7


def test_one_pass_packs_the_linears_the_kernels_take_and_keeps_the_rest_gptq():
    """Groups of 16 inputs have no kernel group: that spec's linears stay GPTQLinears, shaped as
    GPTQ stores them; groups of 32 pack for the kernel. A size GPTQ cannot pack is one line."""
    names = ["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"]
    for spec, kind in ((GPTQSpec(group_size=32, desc_act=True), Int4Linear), (GPTQSpec(group_size=16), GPTQLinear)):
        with torch.device("meta"):
            model = Qwen2ForCausalLM(tiny_qwen_config(hidden_size=128, intermediate_size=256))
        replace_linears_with_gptq_int4(model, names, spec, torch.float32, CPU)
        up, down = (model.get_submodule(name) for name in names)
        assert type(up) is type(down) is kind and (up.in_features, up.out_features) == (128, 256)
        assert isinstance(model.model.layers[0].mlp.gate_proj, nn.Linear)  # not named: left as it was
        assert kind is GPTQLinear or (up.perm is not None and up.group_size == 32)
        assert kind is Int4Linear or tuple(down.qweight.shape) == (256 // 8, 128)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(tiny_qwen_config(hidden_size=128, intermediate_size=250))
    with pytest.raises(SpecchatError, match="divisible by 8; 'model.layers.0.mlp.up_proj'"):
        replace_linears_with_gptq_int4(model, names[:1], GPTQSpec(group_size=32), torch.float32, CPU)
