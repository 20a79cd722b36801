"""A Mixtral GGUF as llama.cpp writes it (architecture `llama`, gguf_moe_writer.py), read as
transformers' MixtralForCausalLM (models/gguf_mixtral.py): its config, and its dense conversion
against a Mixtral filled here from gguf's own dequantization and transformers' own reading of the
attention. test_moe_gguf.py runs the families' tests (the 4-bit experts, streaming, SpecExec) over it."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGUFReader, quants
from helpers.gguf_moe_writer import EXPERTS, HIDDEN, INTERMEDIATE, LAYERS, TOP_K, write_metadata
from helpers.moe import QUIET, Converted, logits
from transformers import AutoConfig, AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.errors import SpecchatError
from specchat.models.configs import read_config
from specchat.models.convert import convert
from specchat.models.loading import load


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> Converted:
    return Converted(tmp_path_factory.mktemp("mixtral"), "mixtral", gguf.GGMLQuantizationType.Q4_K)


def dequantized(reader: GGUFReader, name: str) -> torch.Tensor:
    tensor = next(t for t in reader.tensors if t.name == name)
    return torch.from_numpy(quants.dequantize(tensor.data, tensor.tensor_type).copy())  # gguf maps the file read-only


def reference(path: Path, swap_gate_and_up: bool = False) -> PreTrainedModel:
    """A Mixtral filled independently: attention, norms, embedding and head from transformers' own
    (dense Llama) reading of the file, each router and expert from gguf's dequantization of its tensor."""
    llama = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    state = {name: tensor for name, tensor in llama.state_dict().items() if ".mlp." not in name}
    reader = GGUFReader(path)
    for layer in range(LAYERS):
        block, mlp = f"blk.{layer}", f"model.layers.{layer}.mlp"
        gate, up = (dequantized(reader, f"{block}.ffn_{part}_exps.weight") for part in ("gate", "up"))
        state[f"{mlp}.gate.weight"] = dequantized(reader, f"{block}.ffn_gate_inp.weight")
        state[f"{mlp}.experts.gate_up_proj"] = torch.cat([up, gate] if swap_gate_and_up else [gate, up], dim=1)
        state[f"{mlp}.experts.down_proj"] = dequantized(reader, f"{block}.ffn_down_exps.weight")
    model = MixtralForCausalLM(read_config(str(path))).eval().requires_grad_(False)
    model.load_state_dict(state, strict=True)
    return model


def test_the_config_is_a_mixtral_of_the_files_counts_and_widths(mixtral):
    config, llama = read_config(str(mixtral.gguf)), AutoConfig.from_pretrained(mixtral.gguf.parent,
                                                                              gguf_file=mixtral.gguf.name)
    assert type(config) is MixtralConfig
    assert (config.num_local_experts, config.num_experts_per_tok, config.intermediate_size) == (EXPERTS, TOP_K,
                                                                                                INTERMEDIATE)
    carried = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rms_norm_eps", "rope_parameters", "vocab_size", "max_position_embeddings", "bos_token_id",
               "eos_token_id", "pad_token_id", "tie_word_embeddings")
    assert {key: getattr(config, key) for key in carried} == {key: getattr(llama, key) for key in carried}


def test_the_dense_conversion_gives_an_independent_mixtrals_logits(mixtral):
    dense = mixtral.dense_model()
    assert type(dense) is MixtralForCausalLM and dense.model.layers[0].mlp.experts.gate_up_proj.shape == \
        (EXPERTS, 2 * INTERMEDIATE, HIDDEN)
    expected = logits(CausalLM(reference(mixtral.gguf)))
    torch.testing.assert_close(logits(CausalLM(dense)), expected, atol=1e-5, rtol=0)
    # the check fails for experts fused in the other order
    assert not torch.allclose(logits(CausalLM(reference(mixtral.gguf, swap_gate_and_up=True))), expected, atol=1e-2)


def test_a_mixtral_gguf_given_by_path_loads_as_its_dense_conversion(mixtral):
    loaded = load(str(mixtral.gguf), torch.float32, progress=False).model
    assert type(loaded) is MixtralForCausalLM
    torch.testing.assert_close(logits(CausalLM(loaded)), logits(CausalLM(mixtral.dense_model())), atol=1e-6, rtol=0)


def test_transformers_reads_a_mixtral_gguf_as_a_dense_llama_with_random_mlps(mixtral):
    """Why specchat reads the file itself: should transformers ever load its experts, this fails."""
    model, info = AutoModelForCausalLM.from_pretrained(mixtral.gguf.parent, gguf_file=mixtral.gguf.name,
                                                       output_loading_info=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert {f"model.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")} <= info["missing_keys"]


def write_mixtral_holding(path: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    """A Mixtral's metadata (gguf_moe_writer.py's) with zero tensors of `shapes`, by GGUF name."""
    writer = gguf.GGUFWriter(str(path), "llama")
    write_metadata(writer, "mixtral")
    for name, shape in shapes.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_per_expert_mixtral(path: Path) -> Path:
    """A Mixtral as llama.cpp wrote it before stacking experts: `blk.N.ffn_gate.E.weight`, ..."""
    widths = {"gate": (INTERMEDIATE, HIDDEN), "up": (INTERMEDIATE, HIDDEN), "down": (HIDDEN, INTERMEDIATE)}
    return write_mixtral_holding(path, {"token_embd.weight": (8, HIDDEN)} | {
        f"blk.0.ffn_{part}.{expert}.weight": shape for expert in range(EXPERTS) for part, shape in widths.items()})


@pytest.mark.parametrize("step", ["config", "load", "convert"])
def test_a_mixtral_of_experts_stored_one_tensor_each_is_refused_in_one_line(tmp_path, step):
    path = write_per_expert_mixtral(tmp_path / "old.gguf")
    with pytest.raises(SpecchatError, match=r"old\.gguf stores its Mixtral experts one tensor each "
                                            r"\(blk\.0\.ffn_gate\.0\.weight\)") as refused:
        if step == "config":
            read_config(str(path))
        elif step == "load":
            load(str(path), torch.float32, progress=False)
        else:
            convert(path, tmp_path / "dense", "0" * 64, QUIET)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "dense").exists()


def test_a_tensor_a_mixtral_has_no_place_for_is_refused_in_one_line(tmp_path):
    path = write_mixtral_holding(tmp_path / "biased.gguf", {"token_embd.weight": (8, HIDDEN),
                                                            "blk.0.attn_q.bias": (HIDDEN,)})
    with pytest.raises(SpecchatError, match=r"^biased\.gguf holds blk\.0\.attn_q\.bias, which a Mixtral has no "
                                            r"place for$"):
        convert(path, tmp_path / "dense", "0" * 64, QUIET)
