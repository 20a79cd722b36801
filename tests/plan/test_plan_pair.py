"""The draft's forms the plan may weigh (plan/pair.py): the one asked for, or auto's measured one on
a CPU; on a GPU auto weighs full weights, int4, nf4 where bitsandbytes runs it (any described card)
and fp8 where this GPU multiplies it; of those forms, only int4 counts its products' temporary."""

import importlib.util

import pytest
import torch

import specchat.plan.pair as pair_module
from specchat.plan.pair import draft_candidates, draft_kinds, has_bitsandbytes
from specchat.plan.request import Pair
from specchat.quant.int4_rtn import ROUND_ROWS

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def this_gpu(monkeypatch):
    """A GPU here that multiplies fp8 (or not), with bitsandbytes installed (or not)."""
    def have(bitsandbytes: bool, fp8: bool) -> None:
        monkeypatch.setattr(pair_module, "has_bitsandbytes", lambda: bitsandbytes)
        monkeypatch.setattr(pair_module, "fp8_runs_on", lambda device: fp8 and device == CUDA)
    return have


@pytest.mark.parametrize("device", [CPU, CUDA])
def test_a_form_asked_for_is_the_only_one(device, this_gpu):
    this_gpu(bitsandbytes=True, fp8=True)
    assert draft_kinds("int8", device, "int8", described=False) == ("int8",)
    assert draft_kinds("nf4", device, None, described=True) == ("nf4",)


def test_auto_on_a_cpu_is_the_form_it_measured_there():
    assert draft_kinds("auto", CPU, "int8", described=False) == ("int8",)
    assert draft_kinds("auto", CPU, None, described=True) == ("auto",)  # not resolved yet: left to the plan


@pytest.mark.parametrize(("bitsandbytes", "fp8", "kinds"), [
    (False, False, ("none", "int4")),
    (True, False, ("none", "int4", "nf4")),
    (False, True, ("none", "int4", "fp8")),
    (True, True, ("none", "int4", "nf4", "fp8")),
])
def test_auto_on_this_gpu_weighs_what_runs_here(this_gpu, bitsandbytes, fp8, kinds):
    this_gpu(bitsandbytes, fp8)
    assert draft_kinds("auto", CUDA, None, described=False) == kinds


def test_auto_on_a_described_card_weighs_nf4_and_never_fp8(this_gpu):
    """bitsandbytes may be missing here and fp8 running here: neither says what the described card runs."""
    this_gpu(bitsandbytes=False, fp8=True)
    assert draft_kinds("auto", CUDA, None, described=True) == ("none", "int4", "nf4")


@pytest.mark.parametrize("installed", [True, False])
def test_bitsandbytes_is_looked_for_by_its_module_name(monkeypatch, installed):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: (object() if installed else None) if name == "bitsandbytes"
                        else found(name, *rest))
    assert has_bitsandbytes() is installed


def test_only_the_int4_form_counts_its_products_temporary_and_it_grows_with_the_tree():
    pair = Pair("llama-2-70b-gptq", torch.bfloat16, draft="llama-2-7b", draft_kinds=("none", "int4", "int8"),
                draft_vocab=32768, context=4096)
    small, large = (draft_candidates(pair, CPU, tree_tokens) for tree_tokens in (257, 1025))
    assert [form.quant for form in small] == ["none", "int4", "int8"]
    assert small[0].workspace == small[2].workspace == 0
    assert 0 < small[1].workspace < large[1].workspace


def test_an_fp8_draft_is_made_on_the_gpu_a_layer_at_a_time_its_input_embedding_on_the_host():
    """Llama-2-7B turned fp8 beside a GPU: nothing passes through RAM; above its weights while it loads,
    one decoder layer in bf16 (4 linears of 4096 x 4096, 3 of 4096 x 11008), the largest linear's
    nibbles and three float32 blocks of ROUND_ROWS rows of the widest input (11008)."""
    pair = Pair("llama-2-70b-gptq", torch.bfloat16, draft="llama-2-7b", draft_kinds=("fp8",), context=4096)
    (fp8,) = draft_candidates(pair, CUDA)
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert (fp8.quant, fp8.load_bytes, fp8.host_embedding) == ("fp8", 0, 32000 * 4096 * 2)
    assert fp8.prepare_bytes == 2 * layer + 4096 * 11008 // 2 + 3 * ROUND_ROWS * 11008 * 4
