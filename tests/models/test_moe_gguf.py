"""MoE targets from GGUF files, their experts kept in the forms llama.cpp stores them: a tiny
Qwen3-MoE and Qwen2-MoE (gguf_moe_writer.py) converted as an embedded model is (models/convert.py,
then models/convert_int4.py), each expert's slice of the stacked `ffn_*_exps` tensors an
Int4Weight (Q4_K) or Q6Weight (Q6_K) under the split model's names; loaded with every expert's
linears as Int4Linears or Q6Linears, giving the dense conversion's logits, streamed by expert as in
memory, and SpecExec over them exact: its tokens are transformers' own reply (greedy `generate`,
seeded tests/helpers/reference_loop.py) on the dense conversion, whose experts are gguf's own
dequantization (checked below), not the project's autoregressive engine's. A Mixtral GGUF
(architecture `llama`) is one more family here; test_moe_gguf_mixtral.py checks what is its own
(its config, its dense conversion's logits)."""

import json

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor, quants
from helpers.disk_full import disk_full
from helpers.gguf_files import random_blocks, write_tiny_gguf
from helpers.gguf_moe_writer import ARCHITECTURES, EXPERTS, HIDDEN, INTERMEDIATE, LAYERS, SHARED, write_moe_gguf
from helpers.moe import CPU, QUIET, SAMPLINGS, Converted, assert_specexec_emits_transformers_tokens, draft_of, logits
from helpers.moe_streams import expert_bytes, fetched_per_pass, record_routes
from helpers.planned import streamed
from helpers.q6_linears import read_q6
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.models import convert_int4 as convert_int4_module
from specchat.models.configs import read_config
from specchat.models.convert import convert
from specchat.models.convert_experts import expert_slice, stored_forms
from specchat.models.convert_int4 import convert_int4, hf_names
from specchat.models.marker import INT4_FORMAT, MARKER
from specchat.offload.build import offload_model
from specchat.quant.gguf_int4 import q4k_to_int4
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_checkpoint import INT4_FILE, read_int4
from specchat.quant.q4k_scales import Q4KScalesLinear
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.split_experts import SplitExperts

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

Q4_K, Q6_K, Q8_0 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0
# (family, the type of ffn_down_exps): Q4_K_M mixes Q4_K and Q6_K; Q8_0 has no stored form kept
VARIANTS = [("qwen3_moe", Q4_K), ("qwen3_moe", Q6_K), ("qwen2_moe", Q4_K), ("mixtral", Q4_K)]
LINEAR_OF = {Q4_K: Int4Linear, Q6_K: Q6Linear, Q8_0: nn.Linear}
PARTS = (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj"))


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: f"{v[0]}-down-{v[1].name}")
def moe(request, tmp_path_factory) -> Converted:
    family, down = request.param
    return Converted(tmp_path_factory.mktemp(f"{family}-{down.name}"), family, down)


def stacked(reader: GGUFReader, layer: int, part: str) -> ReaderTensor:
    """The GGUF's stacked tensor `part` (e.g. ffn_gate_exps) of `layer`."""
    return next(t for t in reader.tensors if t.name == f"blk.{layer}.{part}.weight")


def dequantized(reader: GGUFReader, layer: int, part: str) -> torch.Tensor:
    """gguf's own float32 dequantization of a stacked tensor, [E, O, I]."""
    tensor = stacked(reader, layer, part)
    return torch.from_numpy(quants.dequantize(tensor.data, tensor.tensor_type))


def test_transformers_fuses_gate_then_up_of_ggml_stacked_experts(moe):
    """The order the conversion relies on, read from transformers' own load (a Mixtral's through the
    processors models/gguf_mixtral.py reuses): gate_up_proj[e] is gguf's dequantized
    ffn_gate_exps[e] rows, then ffn_up_exps[e]; down_proj[e] is ffn_down_exps[e]."""
    reader, dense = GGUFReader(moe.gguf), moe.dense_model()
    for layer in range(LAYERS):
        experts = dense.model.layers[layer].mlp.experts
        assert experts.gate_up_proj.shape == (EXPERTS, 2 * INTERMEDIATE, HIDDEN)
        gate, up, down = (dequantized(reader, layer, part) for part, _ in PARTS)
        assert torch.equal(experts.gate_up_proj, torch.cat([gate, up], dim=1))
        assert torch.equal(experts.down_proj, down)


def test_each_experts_slice_is_stored_in_its_gguf_form_and_no_fused_tensor(moe):
    reader = GGUFReader(moe.gguf)
    with safe_open(moe.int4 / INT4_FILE, "pt") as stored:
        names = set(stored.keys())
        assert not any(".experts.gate_up_proj" in n or n.endswith(".experts.down_proj") for n in names)
        for layer in range(LAYERS):
            for part, linear in PARTS:
                tensor = stacked(reader, layer, part)
                for expert in range(EXPERTS):
                    module = f"model.layers.{layer}.mlp.experts.{expert}.{linear}"
                    data = tensor.data[expert]
                    reference = torch.from_numpy(quants.dequantize(data, tensor.tensor_type))  # [O, I]
                    if tensor.tensor_type == Q4_K:
                        weight = read_int4(stored.get_tensor, module)
                        assert torch.equal(weight.nibbles, q4k_to_int4(data).nibbles)
                    else:
                        weight = read_q6(stored.get_tensor, module)
                    assert torch.equal(weight.dequantize(), reference)


def test_the_conversions_marker_counts_every_module_kept_in_a_stored_form(moe):
    record = json.loads((moe.int4 / MARKER).read_text())
    shared = 3 if moe.family == "qwen2_moe" else 0  # its shared expert's three Q4_K linears
    assert record["format"] == INT4_FORMAT and record["int4_tensors"] == str(LAYERS * (3 * EXPERTS + shared))


def test_a_conversion_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    gguf_path, dense = write_moe_gguf(tmp_path / "m.gguf", "qwen3_moe"), tmp_path / "dense"
    convert(gguf_path, dense, "0" * 64, QUIET)

    monkeypatch.setattr(convert_int4_module, "link_dense", disk_full)
    with pytest.raises(OSError, match="No space left"):
        convert_int4(gguf_path, dense, tmp_path / "int4", QUIET)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dense", "m.gguf"]  # no half-converted directory


def experts_linears(layer: nn.Module) -> list[nn.Module]:
    experts = layer.mlp.experts
    assert isinstance(experts, SplitExperts) and experts.num_experts == EXPERTS
    return [experts.get_submodule(f"{e}.{linear}") for e in range(EXPERTS) for _, linear in PARTS]


def test_every_experts_linear_loads_in_its_stored_form_and_no_fused_parameter_is_left(moe):
    model = moe.loaded()
    for layer in model.model.layers:
        kinds = [type(linear) for linear in experts_linears(layer)]
        assert kinds == [Int4Linear, Int4Linear, LINEAR_OF[moe.down]] * EXPERTS
        assert type(layer.mlp.gate.weight) is nn.Parameter and layer.mlp.gate.weight.shape == (EXPERTS, HIDDEN)
        if moe.family == "qwen2_moe":  # the shared expert is a plain MLP of Q4_K linears; its gate stays dense
            shared = layer.mlp.shared_expert
            assert all(type(m) is Int4Linear for m in (shared.gate_proj, shared.up_proj, shared.down_proj))
            assert type(layer.mlp.shared_expert_gate) is nn.Linear
    assert not any(name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name in model.state_dict())
    assert not any(parameter.dim() == 3 for parameter in model.parameters())
    assert not any(t.is_meta for t in model.state_dict().values())


def test_the_4bit_model_gives_the_dense_conversions_logits(moe):
    # the same weights (checked as converted), summed in another order: float32 rounding only
    torch.testing.assert_close(logits(CausalLM(moe.loaded())), logits(CausalLM(moe.dense_model())), atol=1e-5, rtol=0)


def test_experts_streamed_compact_make_their_scales_from_q4k_parts_and_give_the_same_logits(moe):
    model = moe.loaded(compact_layers=True)
    down = Q4KScalesLinear if moe.down == Q4_K else LINEAR_OF[moe.down]
    for layer in model.model.layers:
        assert [type(linear) for linear in experts_linears(layer)] == [Q4KScalesLinear, Q4KScalesLinear, down] * EXPERTS
        if moe.family == "qwen2_moe":  # a plain linear's Q4_K parts are kept too
            shared = layer.mlp.shared_expert
            assert all(type(m) is Q4KScalesLinear for m in (shared.gate_proj, shared.up_proj, shared.down_proj))
    assert torch.equal(logits(CausalLM(model)), logits(CausalLM(moe.loaded())))


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_specexec_over_the_4bit_moe_emits_transformers_tokens_for_its_weights(moe, sampling):
    assert_specexec_emits_transformers_tokens(CausalLM(moe.loaded()), draft_of(moe.dense_model()), moe.dense_model(),
                                              sampling)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_specexec_over_the_4bit_moe_streamed_by_expert_emits_transformers_tokens(moe, tmp_path, tier, sampling):
    with streamed(moe.int4, tier, tmp_path, slots=1) as (lm, offload):
        assert torch.equal(logits(lm), logits(CausalLM(moe.loaded())))
        assert_specexec_emits_transformers_tokens(lm, draft_of(moe.dense_model()), moe.dense_model(), sampling)
        assert offload.stats().fetched_bytes > 0


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_narrow_pass_fetches_exactly_the_experts_its_router_picked(moe, tmp_path, tier):
    with streamed(moe.int4, tier, tmp_path, slots=1) as (lm, offload):
        # streamed, the plan keeps the layers as the GGUF stores them: Q4_K's scale parts, not the
        # kernel's pairs, so each expert's unit is what the model in memory holds in that form
        assert type(lm.model.model.layers[0].skeleton.mlp.experts.get_submodule("0.gate_proj")) is Q4KScalesLinear
        sizes = expert_bytes(moe.loaded(compact_layers=True))
        routes = record_routes(lm)
        for fetched, calls in fetched_per_pass(lm, offload, routes)[1:]:  # the one-token passes
            assert all(len(made) == 1 and len(made[0]) == 2 for made in calls)  # 2 of the 4 experts, a layer
            assert fetched == sum(sizes[layer][e] for layer, made in enumerate(calls) for e in made[0])
    # an expert's unit is its three linears in their stored forms: about 4.6 bits a weight where
    # bf16 would take 16 (Q6_K's down: 8.6)
    bits = 8 * max(size for layer in sizes for size in layer) / (3 * INTERMEDIATE * HIDDEN)
    assert bits < (6.5 if moe.down == Q6_K else 4.7)


def test_another_type_of_expert_is_kept_as_its_dense_slice(tmp_path):
    """ffn_down_exps in Q8_0 (no kernel takes it): each expert's down_proj is its slice of the dense
    conversion, an nn.Linear of the split block, beside the Q4_K gate and up as Int4Linears."""
    moe = Converted(tmp_path, "qwen3_moe", Q8_0)
    model = moe.loaded()
    assert [type(m) for m in experts_linears(model.model.layers[0])] == [Int4Linear, Int4Linear, nn.Linear] * EXPERTS
    fused = moe.dense_model().model.layers[1].mlp.experts.down_proj
    assert torch.equal(model.model.layers[1].mlp.experts.get_submodule("3.down_proj").weight, fused[3])
    torch.testing.assert_close(logits(CausalLM(model)), logits(CausalLM(moe.dense_model())), atol=1e-5, rtol=0)


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
def test_a_slice_is_kept_in_its_stored_form_only_where_it_is_the_dense_weight(qtype):
    data = random_blocks(qtype, 64, 512, seed=4)
    dense = torch.from_numpy(quants.dequantize(data, qtype))
    suffixes = (".int4_nibbles", ".q4k_sc") if qtype == Q4_K else (".q6_values",)
    assert all(f"e.0.down_proj{suffix}" in stored_forms("e.0.down_proj", qtype, data, dense) for suffix in suffixes)
    assert stored_forms("e.0.down_proj", qtype, data, dense[torch.randperm(64)]) == {}  # rows in another order
    assert stored_forms("e.0.down_proj", Q8_0, random_blocks(Q8_0, 64, 512), dense) == {}  # no kernel takes Q8_0


def test_gate_and_up_are_the_halves_of_an_experts_fused_rows():
    fused = torch.arange(3 * 8 * 2, dtype=torch.float32).reshape(3, 8, 2)
    assert torch.equal(expert_slice(fused, 1, "gate"), fused[1, :4])
    assert torch.equal(expert_slice(fused, 1, "up"), fused[1, 4:])
    assert torch.equal(expert_slice(fused, 2, "down"), fused[2])  # down_proj [E, H, I]: an expert's whole matrix


def test_the_dense_conversion_keeps_transformers_fused_experts(moe):
    """--weights dense: the float32 conversion holds no expert per expert, so nothing is split."""
    model, _ = offload_model(moe.dense, "tiny-moe-dense", torch.float32, CPU, None, None, QUIET)
    assert not any(isinstance(module, SplitExperts) for module in model.modules())
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape == (EXPERTS, 2 * INTERMEDIATE, HIDDEN)


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_the_experts_widths_are_read_from_the_file(tmp_path, family):
    path = write_moe_gguf(tmp_path / "m.gguf", family)
    own = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)  # transformers' reading: its class defaults
    config = read_config(str(path))
    assert config.moe_intermediate_size == INTERMEDIATE != own.moe_intermediate_size
    if family == "qwen2_moe":
        assert config.shared_expert_intermediate_size == SHARED != own.shared_expert_intermediate_size


def test_stacked_gate_and_up_map_to_the_fused_gate_up_proj(moe):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(moe.dense))
    names = hf_names(model, ARCHITECTURES[moe.family])
    fused = "model.layers.1.mlp.experts"
    assert (names["blk.1.ffn_gate_exps"], names["blk.1.ffn_up_exps"], names["blk.1.ffn_down_exps"]) == \
        (f"{fused}.gate_up_proj", f"{fused}.gate_up_proj", f"{fused}.down_proj")


def test_a_dense_gguf_reads_the_config_transformers_reads(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    assert read_config(str(tmp_path / "tiny.gguf")).to_dict() == \
        AutoConfig.from_pretrained(tmp_path, gguf_file="tiny.gguf").to_dict()
