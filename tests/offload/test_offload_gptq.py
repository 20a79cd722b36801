"""GPTQ checkpoints: loaded with no extra library (as int4 kernel weights where a kernel group fits),
streamed packed, ~4x fewer bytes than bf16."""

import json
from pathlib import Path

import pytest
import torch
from helpers.gptq_writer import dequantized_linears, load_checkpoint, write_gptq_checkpoint
from helpers.planned import offload_planned
from helpers.tiny import tiny_qwen_config
from torch import nn
from transformers import Qwen2ForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.loading import load
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.gptq import GPTQLinear, GPTQSpec, read_gptq_spec
from specchat.quant.int4 import Int4Linear, int4_fits
from specchat.quant.int4_gptq import spec_group_size

QUIET = Reporter(bars=False)
PROMPT = torch.tensor([3, 14, 15, 9, 26, 5])


@pytest.fixture(scope="module", params=[GPTQSpec(group_size=16, desc_act=True, sym=False), GPTQSpec(group_size=-1)],
                ids=["g16-act-order-asym", "g-1-sym"])
def gptq_dir(request, tmp_path_factory) -> Path:
    torch.manual_seed(7)
    config = tiny_qwen_config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              max_position_embeddings=128, tie_word_embeddings=False)
    return write_gptq_checkpoint(Qwen2ForCausalLM(config).eval(), tmp_path_factory.mktemp("gptq"), request.param)


def dequantized_reference(model: nn.Module) -> CausalLM:
    return CausalLM(dequantized_linears(model))


def logits(lm: CausalLM) -> torch.Tensor:
    return lm.logits(lm.hidden(PROMPT, torch.arange(PROMPT.numel()), new_cache()))


def test_gptq_directory_loads_in_memory_without_extra_libraries(gptq_dir):
    loaded = load(str(gptq_dir), torch.float32, progress=False)
    linears = [m for m in loaded.model.modules() if isinstance(m, (GPTQLinear, Int4Linear))]
    assert len(linears) == 3 * 7  # q, k, v, o, gate, up, down in each layer
    # groups of 16 have no int4 kernel group and stay GPTQLinears; one group over 64 inputs packs for the kernel
    # where the CPU's layout takes the shape (AVX512 tiles 64 output rows: the 32-row k and v stay GPTQLinears)
    spec = read_gptq_spec(json.loads((gptq_dir / "config.json").read_text()))
    for linear in linears:
        group = spec_group_size(spec, linear.in_features)
        packs = group is not None and int4_fits(linear.in_features, linear.out_features, group, torch.device("cpu"))
        assert isinstance(linear, Int4Linear if packs else GPTQLinear)
        assert not any(t.is_meta for t in linear.buffers())
    assert any(isinstance(linear, Int4Linear) for linear in linears) == (spec.group_size != 16)
    reference = dequantized_reference(load_checkpoint(gptq_dir, None))
    torch.testing.assert_close(logits(CausalLM(loaded.model)), logits(reference), atol=1e-5, rtol=0)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_gptq_offloaded_streams_packed_layers_and_matches(gptq_dir, tmp_path, tier):
    plan = PlanRequest(tier=tier, offload_dir=tmp_path, resident_layers=0, slots=2)
    model, offload = offload_planned(gptq_dir, "tiny-gptq", torch.float32, torch.device("cpu"), plan, QUIET)
    place = {p.name: p for p in offload.store.layouts[0].places}
    packed = place.get("self_attn.q_proj.qweight") or place["self_attn.q_proj.packed"]
    assert packed.dtype in (torch.int32, torch.uint8)  # streamed packed: GPTQ's words or the int4 kernel's
    reference = dequantized_reference(load_checkpoint(gptq_dir, None))
    torch.testing.assert_close(logits(CausalLM(model, offload)), logits(reference), atol=1e-5, rtol=0)
    offload.close()


def test_a_4bit_layer_moves_about_4x_fewer_bytes_than_bf16(tmp_path):
    torch.manual_seed(1)
    config = tiny_qwen_config(vocab_size=64, hidden_size=512, intermediate_size=1024, num_hidden_layers=1,
                              num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=128)
    model = Qwen2ForCausalLM(config).eval()
    dense_dir, gptq_dir = tmp_path / "dense", tmp_path / "gptq"
    model.save_pretrained(dense_dir)
    write_gptq_checkpoint(model, gptq_dir, GPTQSpec(group_size=128))
    sizes = []
    for directory in (dense_dir, gptq_dir):
        plan = PlanRequest(tier="ram", offload_dir=tmp_path, resident_layers=0, slots=1)
        _, offload = offload_planned(directory, "m", torch.bfloat16, torch.device("cpu"), plan, QUIET)
        sizes.append(offload.pass_bytes)
        offload.close()
    assert 3.5 < sizes[0] / sizes[1] < 4.0  # 16 bits vs 4 bits plus per-group scales and zeros
