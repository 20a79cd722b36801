"""checkpoint/skeleton.py: a model's modules built on the meta device from its config, then filled
from its checkpoint a part at a time: what stays outside the decoder layers, each layer's tensors,
and the buffers a model computes rather than stores. (The 4-bit forms it builds are tested with
their formats: tests/quant/test_int4_checkpoint.py, test_int4_gptq.py, test_awq.py, test_moe_gptq.py.)"""

import pytest
import torch
from helpers.tiny import tiny_qwen_config
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, Qwen2ForCausalLM

from specchat import bounded_attention
from specchat.checkpoint.skeleton import (build_skeleton, decoder_layers, fill, fill_resident, has_compact_layers,
                                          layer_linears, layer_tensors, without_quantization)
from specchat.checkpoint.sources import SafetensorsSource
from specchat.errors import SpecchatError
from specchat.quant.q4k_scales import Q4K_SUFFIXES

CPU = torch.device("cpu")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def saved(directory, tied: bool = False, without: str | None = None) -> Qwen2ForCausalLM:
    """A tiny float32 Qwen2 written to `directory` as one safetensors file (less tensor `without`)."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=tied)).eval()
    model.config.save_pretrained(directory)
    tensors = {name: tensor.contiguous() for name, tensor in model.state_dict().items()
               if name != without and not (tied and name == "lm_head.weight")}
    save_file(tensors, directory / "model.safetensors")
    return model


def skeleton_of(directory, dtype: torch.dtype = torch.float32):
    source = SafetensorsSource(directory)
    return build_skeleton(AutoConfig.from_pretrained(directory), source, dtype), source


def test_a_skeleton_holds_no_weights_and_attends_in_bounded_calls():
    model = build_skeleton(tiny_qwen_config(), None, torch.bfloat16)
    assert all(t.is_meta for t in model.state_dict(keep_vars=True).values())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and not model.training
    assert model.model.layers[0].self_attn.config._attn_implementation == bounded_attention.GROUPED


def test_the_dense_form_of_a_quantized_config_drops_only_its_quantization():
    config = tiny_qwen_config()
    config.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    dense = without_quantization(config)
    assert not hasattr(dense, "quantization_config") and type(dense) is type(config)
    assert dense.to_dict() == {k: v for k, v in config.to_dict().items() if k != "quantization_config"}


def test_the_layers_linears_are_every_decoder_layers_by_their_dotted_names():
    model = build_skeleton(tiny_qwen_config(), None, torch.float32)
    assert decoder_layers(model) == ("model.layers", model.model.layers)
    assert layer_linears(model) == [f"model.layers.{i}.{linear}" for i in range(2) for linear in LINEARS]


def test_a_model_without_a_decoder_layer_list_cannot_be_offloaded():
    class Flat(nn.Module):
        def get_decoder(self) -> nn.Module:
            return self

    with pytest.raises(SpecchatError, match="^Flat has no decoder layer list: it cannot be offloaded$"):
        decoder_layers(Flat())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_resident_parts_are_filled_and_the_layers_left_empty(tmp_path, tied):
    original = saved(tmp_path, tied)
    model, source = skeleton_of(tmp_path)
    fill_resident(model, "model.layers", source, torch.float32, CPU)
    stored = original.state_dict()
    for name, tensor in model.state_dict(keep_vars=True).items():
        assert tensor.is_meta is name.startswith("model.layers."), name
        if not tensor.is_meta:
            assert torch.equal(tensor, stored[name]), name
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    assert not model.model.embed_tokens.weight.requires_grad
    # rotary's frequencies, computed and never stored, are built again for real
    assert torch.equal(model.model.rotary_emb.inv_freq, original.model.rotary_emb.inv_freq)


def test_a_checkpoint_lacking_a_resident_tensor_is_one_line(tmp_path):
    saved(tmp_path, without="model.norm.weight")
    model, source = skeleton_of(tmp_path)
    with pytest.raises(SpecchatError, match="^the checkpoint lacks tensors this model needs: model.norm.weight$"):
        fill_resident(model, "model.layers", source, torch.float32, CPU)


def test_a_layers_tensors_are_read_by_its_own_names_in_the_run_dtype(tmp_path):
    original = saved(tmp_path)
    model, source = skeleton_of(tmp_path, torch.bfloat16)
    layer = model.model.layers[1]
    tensors = layer_tensors(layer, "model.layers.1.", source, torch.bfloat16)
    assert set(tensors) == set(layer.state_dict())
    for name, tensor in tensors.items():
        stored = original.model.layers[1].state_dict()[name]
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, stored.bfloat16())
    wanted = layer_tensors(layer, "model.layers.1.", source, torch.bfloat16, lambda name: name.startswith("mlp."))
    assert set(wanted) == {name for name in tensors if name.startswith("mlp.")}


def test_a_filled_tensor_is_a_copy_never_the_files_memory(tmp_path):
    saved(tmp_path)
    model, source = skeleton_of(tmp_path)
    layer = model.model.layers[0]
    read = {name: source.get(f"model.layers.0.{name}") for name in layer.state_dict()}
    fill(layer, read, CPU)
    for name, tensor in layer.state_dict(keep_vars=True).items():
        assert torch.equal(tensor, read[name]) and tensor.data_ptr() != read[name].data_ptr(), name
    assert all(isinstance(p, nn.Parameter) and not p.requires_grad for p in layer.parameters())


@pytest.mark.parametrize("extra,compact", [(None, False), ("model.layers.1.mlp.up_proj", True), ("lm_head", False)],
                         ids=["plain", "a-layers-q4k-scales", "the-heads-q4k-scales"])
def test_only_q4k_scale_parts_in_a_decoder_layer_make_its_layers_compact(tmp_path, extra, compact):
    """Where a decoder layer's linear is stored with Q4_K's scale parts (a GGUF's conversion), the
    plan weighs the layers kept in that form (Q6_K weights count too: tests/quant/test_q6k.py)."""
    saved(tmp_path)
    if extra is not None:
        save_file({extra + Q4K_SUFFIXES[0]: torch.zeros(2, dtype=torch.uint8)}, tmp_path / "q4k.safetensors")
    model, source = skeleton_of(tmp_path)
    assert has_compact_layers(model, source) is compact
