"""models/loading.py's front door: an embedded model run from its 4-bit weights (`weights`
quantized), its 4-bit conversion loaded with each linear in its stored form, its tokenizer the
dense conversion's, its logits the dense model's; a model with no 4-bit weights to run refused in
one line; a tokenizer loaded from byte-identical files used again, in memory and offloaded; the
tokenizer alone; a GGUF file prepared (the draft's approximations) once loaded whole, a converted
model layer by layer as it loads; each form of an offloaded model streaming from its own layer
file; weights at unaligned addresses copied into aligned memory."""

import shutil
from pathlib import Path

import pytest
import torch
from helpers.gguf_files import fake_draft, tiny_gguf  # noqa: F401 (fixtures)
from helpers.gguf_q4km_writer import COMPACT_BOUND, IN_MEMORY_BOUND, fake_q4km_draft  # noqa: F401 (a fixture)
from helpers.moe import logits

from specchat.decoding.forward import CausalLM
from specchat.errors import SpecchatError
from specchat.models.embedded import converted_path, ensure_embedded, int4_path
from specchat.models.loading import load, load_offloaded, load_tokenizer, own_aligned_weights
from specchat.models.registry import DEFAULT_DRAFT
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_embedding import Int4Embedding
from specchat.quant.q4k_scales import Q4KScalesLinear
from specchat.quant.q6k_linear import Q6Linear


def test_quantized_weights_load_the_4bit_conversion_with_the_dense_tokenizer_and_logits(fake_q4km_draft):
    quantized = load(DEFAULT_DRAFT, torch.float32, progress=False, weights="quantized")
    dense = load(DEFAULT_DRAFT, torch.float32, progress=False)
    assert quantized.directory == int4_path(fake_q4km_draft) and dense.directory == converted_path(fake_q4km_draft)
    assert type(quantized.model.model.layers[1].mlp.gate_proj) is Int4Linear
    assert type(quantized.model.model.embed_tokens) is Int4Embedding
    assert not quantized.model.training and not any(p.requires_grad for p in quantized.model.parameters())
    text = "the tiny model"
    assert quantized.tokenizer(text)["input_ids"] == dense.tokenizer(text)["input_ids"]
    assert quantized.tokenizer.chat_template == dense.tokenizer.chat_template
    torch.testing.assert_close(logits(CausalLM(quantized.model)), logits(CausalLM(dense.model)),
                               atol=IN_MEMORY_BOUND, rtol=0)


def test_quantized_weights_load_compact_where_asked(fake_q4km_draft):
    compact = load(DEFAULT_DRAFT, torch.float32, progress=False, weights="quantized", compact_head=True,
                   compact_layers=True).model
    assert type(compact.model.layers[1].mlp.gate_proj) is Q4KScalesLinear and type(compact.lm_head) is Q6Linear
    assert type(compact.model.layers[0].mlp.down_proj) is Q6Linear  # stored in Q6_K (gguf_q4km_writer.py)


def test_quantized_weights_of_a_model_that_stores_none_are_refused_in_one_line(tiny_gguf):  # noqa: F811
    words = (r"^--weights quantized runs a model from the 4-bit weights it stores, and tiny stores none that "
             r"specchat multiplies packed: use --weights dense$")
    with pytest.raises(SpecchatError, match=words):
        load(str(tiny_gguf), torch.float32, progress=False, weights="quantized")


def test_a_tokenizer_from_byte_identical_files_is_used_again(fake_draft, tmp_path):  # noqa: F811
    dense = load(DEFAULT_DRAFT, torch.float32, progress=False)
    copy = tmp_path / "copy"
    shutil.copytree(dense.directory, copy)
    assert load(str(copy), torch.float32, progress=False, tokenizer=dense.tokenizer).tokenizer is dense.tokenizer
    (copy / "tokenizer_config.json").write_text((copy / "tokenizer_config.json").read_text().replace("}", ' }', 1))
    other = load(str(copy), torch.float32, progress=False, tokenizer=dense.tokenizer).tokenizer
    assert other is not dense.tokenizer and Path(other.name_or_path) == copy


def test_an_offloaded_model_uses_again_a_tokenizer_from_its_own_files(fake_draft, tmp_path):  # noqa: F811
    dense = load(DEFAULT_DRAFT, torch.float32, progress=False)
    steps: list[str] = []
    request = PlanRequest(tier="ram", offload_dir=tmp_path / "layers", resident_layers=0, slots=2)
    placement = plan_checkpoint(dense.directory, "tiny", torch.float32, Machine(kind="cpu"), request).placement
    loaded, offload = load_offloaded(DEFAULT_DRAFT, torch.float32, torch.device("cpu"), placement, tmp_path / "layers",
                                     Reporter(False, lambda step, _: steps.append(step)), tokenizer=dense.tokenizer)
    try:
        assert loaded.tokenizer is dense.tokenizer and offload.streamed == (0, 1)
        assert steps[0] == f"loading {DEFAULT_DRAFT}, decoder layers offloaded (0 resident, 2 in RAM, 0 on disk)"
    finally:
        offload.close()


def test_the_tokenizer_alone_is_the_one_the_model_loads_with(tiny_gguf, fake_draft):  # noqa: F811
    for spec in (str(tiny_gguf), DEFAULT_DRAFT):
        alone = load_tokenizer(spec, progress=False)
        text = "<|im_start|>user\nthe tiny model<|im_end|>"
        assert alone(text)["input_ids"] == load(spec, torch.float32, progress=False).tokenizer(text)["input_ids"]
        assert alone.chat_template and alone.eos_token == "<|im_end|>"


class Counting:
    """A Preparation that counts what it is handed."""

    def __init__(self) -> None:
        self.heads: list[tuple[int, str, Path]] = []
        self.layers = 0
        self.mapped_asked = 0  # asked only where the model loads layer by layer (models/layerwise.py)

    def mapped(self, model) -> frozenset[str]:
        self.mapped_asked += 1
        return frozenset()

    def on_host(self, model) -> frozenset[str]:
        return frozenset()

    def prepare_head(self, model, tokenizer, directory) -> None:
        self.heads.append((model.config.num_hidden_layers, tokenizer.eos_token, directory))

    def prepare_layer(self, layer) -> None:
        self.layers += 1


def test_a_gguf_file_is_prepared_once_loaded_whole(tiny_gguf):  # noqa: F811
    preparation = Counting()
    loaded = load(str(tiny_gguf), torch.float32, progress=False, preparation=preparation)
    assert preparation.heads == [(2, "<|im_end|>", tiny_gguf.parent)] and preparation.layers == 2
    assert preparation.mapped_asked == 0 and not loaded.model.training


def test_a_converted_model_is_prepared_as_it_loads_layer_by_layer(fake_draft):  # noqa: F811
    directory = load(DEFAULT_DRAFT, torch.float32, progress=False).directory
    preparation = Counting()
    loaded = load(str(directory), torch.float32, progress=False, preparation=preparation)
    assert preparation.heads == [(2, "<|im_end|>", directory)] and preparation.layers == 2
    assert preparation.mapped_asked == 1 and not loaded.model.training


def test_each_form_of_an_offloaded_model_streams_from_its_own_layer_file(fake_q4km_draft, tmp_path):
    request = PlanRequest(tier="disk", offload_dir=tmp_path / "layers", resident_layers=0, slots=2)
    dense = load(DEFAULT_DRAFT, torch.float32, progress=False)
    files = []
    for weights in ("quantized", "dense"):
        directory = ensure_embedded(DEFAULT_DRAFT, False, weights=weights)
        memory = plan_checkpoint(directory, "tiny", torch.float32, Machine(kind="cpu"), request)
        loaded, offload = load_offloaded(DEFAULT_DRAFT, torch.float32, torch.device("cpu"), memory.placement,
                                         tmp_path / "layers", Reporter(False), weights, None, memory.compact_head,
                                         memory.compact_layers)
        try:
            assert loaded.directory == directory and offload.streamed == (0, 1)
            assert loaded.tokenizer.eos_token == "<|im_end|>"  # its own, none given
            files.append(sorted(path.stem for path in (tmp_path / "layers").glob("*.layers")))
            streamed = logits(CausalLM(loaded.model, offload))
            if weights == "dense":  # the same weights multiplied alike: bitwise (measured: 0.0)
                assert torch.equal(streamed, logits(CausalLM(dense.model)))
            else:  # the plan streams its layers compact here
                assert memory.compact_layers
                torch.testing.assert_close(streamed, logits(CausalLM(dense.model)), atol=COMPACT_BOUND, rtol=0)
        finally:
            offload.close()
    (quantized,), both = files
    dense_file = f"{DEFAULT_DRAFT}-float32"
    assert quantized.startswith(f"{DEFAULT_DRAFT}-int4-") and both == sorted([quantized, dense_file])


def test_weights_at_unaligned_addresses_are_copied_and_aligned_ones_kept():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).requires_grad_(False)
    storage = torch.zeros(64 + 16)
    unaligned = storage[2:18].view(4, 4)  # 8 bytes past the allocator's 64-byte alignment
    model[0].weight.data = unaligned
    aligned = model[1].weight.data_ptr()
    assert unaligned.data_ptr() % 64 == 8 and aligned % 64 == 0
    own_aligned_weights(model)
    assert model[0].weight.data_ptr() % 64 == 0 and model[0].weight.data_ptr() != unaligned.data_ptr()
    assert torch.equal(model[0].weight, unaligned) and model[1].weight.data_ptr() == aligned
