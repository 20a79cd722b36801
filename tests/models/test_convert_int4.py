"""The 4-bit conversion of a dense GGUF laid out as Q4_K_M (helpers/gguf_q4km_writer.py): each Q4_K
linear and the Q4_K embedding kept as an Int4Weight, each Q6_K linear (the LM head, layer 0's v
and down projections) as a Q6Weight, counted in the marker; loaded, the model holds each in its
stored form and gives the dense conversion's logits, in memory and with compact layers and head.
MoE files, whose experts take another path, are test_moe_gguf.py's."""

import json

import pytest
import torch
from helpers.gguf_q4km_writer import COMPACT_BOUND, IN_MEMORY_BOUND, LAYERS, WIDER, write_q4km_gguf
from helpers.moe import CPU, QUIET, logits
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.models.convert import convert
from specchat.models.convert_int4 import convert_int4
from specchat.models.marker import INT4_FORMAT, MARKER
from specchat.offload.build import offload_model
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_checkpoint import INT4_FILE, int4_modules
from specchat.quant.int4_embedding import Int4Embedding
from specchat.quant.q4k_scales import Q4KScalesLinear
from specchat.quant.q6k import q6_modules
from specchat.quant.q6k_linear import Q6Linear

pytestmark = pytest.mark.slow  # seconds: scheduled before the short modules (helpers/fixtures.py)

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def stored_q6(layer: int, linear: str) -> bool:
    """Whether the file stores that linear in Q6_K (the rest of a layer's are Q4_K)."""
    return layer in WIDER and linear in ("v_proj", "down_proj")


def layer_linears(layer: int) -> list[str]:
    return [f"model.layers.{layer}.self_attn.{n}" for n in ATTENTION] + [f"model.layers.{layer}.mlp.{n}" for n in MLP]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("q4km")
    gguf = write_q4km_gguf(root / "tiny-q4km.gguf")
    convert(gguf, root / "dense", "0" * 64, QUIET)
    convert_int4(gguf, root / "dense", root / "int4", QUIET)
    return root


def loaded(converted, compact: bool = False) -> PreTrainedModel:
    """The 4-bit conversion in memory, as models.loading.load builds it (`compact`: layers and head kept
    in their stored forms, as a plan short of memory keeps them)."""
    model, _ = offload_model(converted / "int4", "tiny-q4km", torch.float32, CPU, None, None, QUIET,
                             compact_head=compact, compact_layers=compact)
    return model


def dense_model(converted) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(converted / "dense", dtype=torch.float32).eval().requires_grad_(False)


def test_each_q4k_tensor_is_kept_as_int4_and_each_q6k_linear_as_q6(converted):
    with safe_open(str(converted / "int4" / INT4_FILE), "pt") as stored:
        names = list(stored.keys())
    linears = [name for layer in range(LAYERS) for name in layer_linears(layer)]
    q6 = [name for name in linears if stored_q6(int(name.split(".")[2]), name.rsplit(".", 1)[1])]
    assert sorted(int4_modules(names)) == sorted(["model.embed_tokens", *(n for n in linears if n not in q6)])
    assert sorted(q6_modules(names)) == sorted(["lm_head", *q6])


def test_the_marker_counts_every_module_kept_in_a_stored_form(converted):
    record = json.loads((converted / "int4" / MARKER).read_text())
    linears = len(ATTENTION) + len(MLP)
    assert record["format"] == INT4_FORMAT and record["int4_tensors"] == str(1 + LAYERS * linears + 1)


@pytest.mark.parametrize("compact", [False, True], ids=["in-memory", "compact"])
def test_each_linear_loads_in_its_stored_form(converted, compact):
    model = loaded(converted, compact)
    q4k, q6k = (Q4KScalesLinear, Q6Linear) if compact else (Int4Linear, nn.Linear)
    for index, layer in enumerate(model.model.layers):
        for linear in layer_linears(index):
            kind = q6k if stored_q6(index, linear.rsplit(".", 1)[1]) else q4k
            assert type(model.get_submodule(linear)) is kind, linear
    assert type(model.model.embed_tokens) is Int4Embedding
    assert type(model.lm_head) is (Q6Linear if compact else nn.Linear)


def test_the_4bit_model_gives_the_dense_conversions_logits(converted):
    dense = logits(CausalLM(dense_model(converted)))
    torch.testing.assert_close(logits(CausalLM(loaded(converted))), dense, atol=IN_MEMORY_BOUND, rtol=0)
    torch.testing.assert_close(logits(CausalLM(loaded(converted, compact=True))), dense, atol=COMPACT_BOUND, rtol=0)
