"""A checkpoint of Int4Weights beside its dense tensors (what models/convert_int4.py writes for a
GGUF's Q4_K linears) loads as Int4Linears, in memory and streamed, holding exactly the dense
model's weights; its packed layout is made once per machine (int4_cache) and read back after."""

from pathlib import Path

import pytest
import torch
from helpers.planned import offload_planned
from helpers.tiny import tiny_qwen_config
from safetensors.torch import save_file
from transformers import AutoConfig, Qwen2ForCausalLM

import specchat.checkpoint.skeleton as skeleton
from specchat.checkpoint.sources import SafetensorsSource
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.models.loading import is_int4, load
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.gguf_int4 import matches
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_cache import cache_path
from specchat.quant.int4_checkpoint import INT4_FILE, INT4_SUFFIXES, int4_entries, int4_modules
from specchat.quant.int4_embedding import Int4Embedding
from specchat.quant.int4_weight import Int4Weight

QUIET = Reporter(False)
PROMPT = torch.tensor([[3, 17, 42, 9, 77, 5, 120, 64]])
PACKED = ("q_proj", "k_proj", "v_proj", "gate_proj", "down_proj")  # o_proj and up_proj stay dense, as Q6_K ones do


def random_int4(out_features: int, in_features: int, generator: torch.Generator) -> Int4Weight:
    groups = in_features // 32
    nibbles = torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8, generator=generator)
    scales = torch.rand(groups, out_features, generator=generator) / 64
    zeros = (torch.rand(groups, out_features, generator=generator) - 0.5) / 32
    return Int4Weight(nibbles, scales, zeros, None)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny Qwen2 whose PACKED linears and token embedding hold random Int4Weights:
    int4.safetensors holds them, and the dense model.safetensors their float32 weights (the dense
    conversion's)."""
    directory = tmp_path_factory.mktemp("int4")
    config = tiny_qwen_config(vocab_size=128, hidden_size=128, intermediate_size=256, max_position_embeddings=64,
                              tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(3)
    tensors = {}
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in PACKED:
            weight = random_int4(module.out_features, module.in_features, generator)
        elif module is model.get_input_embeddings():  # a GGUF's Q4_K token embedding
            weight = random_int4(module.num_embeddings, module.embedding_dim, generator)
        else:
            continue
        module.weight.data = weight.dequantize()
        tensors |= int4_entries(name, weight)
    model.save_pretrained(directory)
    save_file(tensors, str(directory / INT4_FILE))
    return directory


def logits(lm: CausalLM) -> torch.Tensor:
    return lm.logits(lm.hidden(PROMPT, torch.arange(PROMPT.shape[1]), new_cache()))


def dense_logits(directory: Path) -> torch.Tensor:
    return logits(CausalLM(Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()))


def test_the_checkpoint_names_its_int4_modules(checkpoint):
    assert is_int4(checkpoint)
    names = int4_modules(["model.layers.0.mlp.gate_proj.int4_nibbles", "model.layers.0.mlp.gate_proj.int4_scales",
                          "model.layers.0.mlp.up_proj.weight"])
    assert names == ["model.layers.0.mlp.gate_proj"]


def test_it_loads_as_int4_linears_holding_the_dense_weights(checkpoint):
    loaded = load(str(checkpoint), torch.float32, progress=False)
    packed = {name for name, m in loaded.model.named_modules() if isinstance(m, Int4Linear)}
    assert packed == {f"model.layers.{i}.{part}.{name}" for i in range(2) for name in PACKED
                      for part in (("self_attn",) if name.endswith(("q_proj", "k_proj", "v_proj")) else ("mlp",))}
    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, torch.nn.Linear)
    # float32: the fused CPU kernel's weights are the Int4Weight's bitwise; sums differ in order only
    torch.testing.assert_close(logits(CausalLM(loaded.model)), dense_logits(checkpoint), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", [None, torch.device("cpu"), torch.device("cuda")], ids=["unnamed", "cpu", "cuda"])
def test_a_skeletons_int4_linears_are_laid_out_for_the_kernel_named_or_the_cpus(checkpoint, kernel):
    """Built on meta for a GPU's kernel (the plan's skeleton of a CUDA run) or, unnamed, a CPU's."""
    model = skeleton.build_skeleton(AutoConfig.from_pretrained(checkpoint), SafetensorsSource(checkpoint),
                                    torch.bfloat16, kernel=kernel)
    kernels = {m.kernel for m in model.modules() if isinstance(m, Int4Linear)}
    assert kernels == {"cpu" if kernel is None else kernel.type}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_its_embedding_is_looked_up_in_4_bits_as_the_dense_rows(checkpoint, dtype):
    loaded = load(str(checkpoint), dtype, progress=False)
    embedding = loaded.model.get_input_embeddings()
    assert isinstance(embedding, Int4Embedding) and not any(b.numel() > 10**4 for b in embedding.buffers())
    dense = SafetensorsSource(checkpoint).get("model.embed_tokens.weight")
    ids = torch.tensor([[0, 127, 5], [5, 64, 3]])
    assert torch.equal(embedding(ids), dense[ids].to(dtype))


def test_it_is_packed_once_per_machine_and_its_nibbles_then_left_unread(checkpoint, monkeypatch):
    kept = cache_path(checkpoint, "cpu")
    kept.unlink(missing_ok=True)
    first = logits(CausalLM(load(str(checkpoint), torch.float32, progress=False).model))
    assert kept.is_file()

    def no_packing(*args):
        raise AssertionError("packed again: the kept layout was not read")

    read = SafetensorsSource.get

    def no_nibbles(source, name):
        # the embedding is looked up in its nibbles themselves: no kernel layout replaces them
        packed_linear = name.endswith(INT4_SUFFIXES[0]) and not name.startswith("model.embed_tokens.")
        assert not packed_linear, f"read {name}, which the kept layout replaces"
        return read(source, name)

    monkeypatch.setattr(skeleton, "pack", no_packing)
    monkeypatch.setattr(SafetensorsSource, "get", no_nibbles)
    again = logits(CausalLM(load(str(checkpoint), torch.float32, progress=False).model))
    assert torch.equal(again, first)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_streamed_layers_hold_the_packed_bytes(checkpoint, tmp_path, tier):
    plan = PlanRequest(tier=tier, offload_dir=tmp_path, resident_layers=0, slots=2)
    model, offload = offload_planned(checkpoint, "tiny-int4", torch.float32, torch.device("cpu"), plan, QUIET)
    try:
        places = {p.name: p for p in offload.store.layouts[0].places}
        assert places["mlp.gate_proj.packed"].dtype == torch.uint8 and "mlp.gate_proj.weight" not in places
        assert places["mlp.up_proj.weight"].dtype == torch.float32
        torch.testing.assert_close(logits(CausalLM(model, offload)), dense_logits(checkpoint), atol=1e-5, rtol=0)
    finally:
        offload.close()


def test_a_weight_matches_only_its_own_dense_tensor():
    weight = random_int4(64, 128, torch.Generator().manual_seed(5))
    dense = weight.dequantize()
    assert matches(weight, dense)
    assert not matches(weight, dense[torch.randperm(64)])  # rows reordered, as Llama's q and k are
    assert not matches(weight, dense.t().contiguous().t()[:32])
