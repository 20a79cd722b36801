"""A Q6_K tensor kept in 8.6 bits a weight (quant/q6k.py) and multiplied a chunk of rows at a time
(quant/q6k_linear.py): its weights are gguf's own dequantization bitwise, in any dtype the dense
conversion's rounded once; a plan short of memory keeps the LM head so, and only then."""

import math
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, quants
from helpers.gguf_files import random_blocks
from helpers.planned import offload_planned
from helpers.q6_linears import q6_linear
from helpers.tiny import tiny_qwen_config
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoConfig, Qwen2ForCausalLM

from specchat.checkpoint.sources import SafetensorsSource
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.errors import SpecchatError
from specchat.models.loading import load
from specchat.plan.budget import Ask, Target, plan_memory
from specchat.plan.demand import ModelShape
from specchat.plan.model import measure_model
from specchat.plan.placement import ModelSizes, Request, Rooms
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant import q6k_linear
from specchat.quant.int4_checkpoint import INT4_FILE
from specchat.quant.q6k import q6_bytes, q6_entries, q6k_to_weight
from specchat.quant.q6k_linear import Q6Linear

Q6_K = GGMLQuantizationType.Q6_K
CPU = torch.device("cpu")


def test_q6k_blocks_convert_to_gguf_own_weights_bitwise():
    data = random_blocks(Q6_K, 48, 768, seed=2)
    weight = q6k_to_weight(data)
    reference = torch.from_numpy(quants.dequantize(data, Q6_K))
    assert weight.values.dtype == torch.int8 and int(weight.values.min()) >= -32 and int(weight.values.max()) <= 31
    assert torch.equal(weight.dequantize(), reference)
    assert torch.equal(weight.dequantize(slice(5, 17)), reference[5:17])
    stored = sum(t.numel() * t.element_size() for t in q6_entries("head", weight).values())
    assert stored == q6_bytes(48, 768) == 48 * 768 * (1 + 1 / 16 + 4 / 256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunked_product_multiplies_by_the_dense_weight_rounded_once(monkeypatch, dtype):
    monkeypatch.setattr(q6k_linear, "CHUNK_WEIGHTS", 24 * 512)  # 4 chunks of 80 rows, the last one short
    linear, dense = q6_linear(80, 512)
    # an identity input reads each weight back alone: no sum can round it
    assert torch.equal(linear(torch.eye(512, dtype=dtype)), dense.to(dtype).t())
    x = torch.randn(2, 3, 512, dtype=dtype)
    # sums over chunks of rows are the whole product's sums: only their order may differ
    torch.testing.assert_close(linear(x), x @ dense.to(dtype).t(), rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 0.05)


def test_rows_wider_than_a_chunk_expand_one_at_a_time(monkeypatch):
    monkeypatch.setattr(q6k_linear, "CHUNK_WEIGHTS", 256)  # half a row of 512 inputs
    assert q6k_linear.chunk_rows(512, 80) == 1
    linear, dense = q6_linear(80, 512)
    assert torch.equal(linear(torch.eye(512)), dense.t())


Q6_MODULES = ("lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.v_proj")  # v has a bias


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny untied Qwen2 whose LM head and Q6_MODULES hold random Q6_K blocks: their Q6Weights in
    int4.safetensors and their float32 dequantization in the dense model.safetensors, as
    models/convert_int4.py writes."""
    directory = tmp_path_factory.mktemp("q6")
    config = tiny_qwen_config(vocab_size=96, hidden_size=256, intermediate_size=512, max_position_embeddings=64,
                              tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    tensors = {}
    for seed, name in enumerate(Q6_MODULES):
        linear = model.get_submodule(name)
        data = random_blocks(Q6_K, linear.out_features, linear.in_features, seed=seed)
        linear.weight.data = torch.from_numpy(quants.dequantize(data, Q6_K))
        tensors |= q6_entries(name, q6k_to_weight(data))
    model.save_pretrained(directory)
    save_file(tensors, str(directory / INT4_FILE))
    return directory


def test_a_compact_head_loads_as_a_q6_linear_holding_the_dense_weights(checkpoint):
    dense = load(str(checkpoint), torch.bfloat16, progress=False).model.get_output_embeddings()
    compact = load(str(checkpoint), torch.bfloat16, progress=False, compact_head=True).model.get_output_embeddings()
    assert isinstance(dense, torch.nn.Linear) and isinstance(compact, Q6Linear)
    assert torch.equal(compact(torch.eye(256, dtype=torch.bfloat16)), dense.weight.t())


def logits(model, stream=None) -> torch.Tensor:
    lm, prompt = CausalLM(model, stream), torch.tensor([5, 17, 3, 88, 42])
    return lm.logits(lm.hidden(prompt, torch.arange(5), new_cache()))


def test_streamed_compact_layers_hold_the_stored_q6_bytes_and_score_as_the_dense_model(checkpoint, tmp_path):
    dense = load(str(checkpoint), torch.float32, progress=False).model
    plan = PlanRequest(tier="disk", offload_dir=tmp_path, resident_layers=0, slots=2)
    model, offload = offload_planned(checkpoint, "tiny-q6", torch.float32, torch.device("cpu"), plan, Reporter(False),
                                     compact_layers=True)
    try:
        places = {place.name: place for place in offload.store.layouts[0].places}
        assert places["mlp.down_proj.q6_values"].dtype == torch.int8 and "mlp.down_proj.weight" not in places
        assert "self_attn.v_proj.weight" in places  # layer 0's v is dense in the checkpoint
        assert offload.store.path.name.startswith("tiny-q6-q6")  # a layer file of its own
        torch.testing.assert_close(logits(model, offload), logits(dense), rtol=1e-5, atol=1e-5)
    finally:
        offload.close()


def test_the_plan_weighs_the_stored_q6_head_in_place_of_the_dense_one(checkpoint):
    """The fixed parts' bytes with the head as stored, the form a short plan may choose: the dense bf16
    head (96 x 256) out, its Q6Weight in (an int8 value a weight, an int8 scale a 16, a float32 scale a
    256) and a call's chunk buffers (its 96 rows at once: float32 values and bf16 weights, float32
    scales); a checkpoint without a stored head has no such form."""
    request = PlanRequest(tier="none", offload_dir=checkpoint, tree_tokens=2)
    config = AutoConfig.from_pretrained(checkpoint)
    target = measure_model(config, SafetensorsSource(checkpoint), "tiny-q6", torch.bfloat16, CPU, request).target
    weights = 96 * 256
    q6_head = weights + weights // 16 + weights // 256 * 4
    buffers = 96 * (256 * (4 + 2) + 256 // 16 * 4)
    assert target.compact_fixed == target.sizes.fixed - weights * 2 + q6_head + buffers
    assert measure_model(config, None, "tiny-q6", torch.bfloat16, CPU, request).target.compact_fixed is None


def test_a_compact_head_the_checkpoint_lacks_is_one_line(tmp_path):
    Qwen2ForCausalLM(tiny_qwen_config(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                      tie_word_embeddings=False)
                     ).save_pretrained(tmp_path)
    down = q6k_to_weight(random_blocks(Q6_K, 256, 512))  # a Q6Weight, but for another module
    save_file(q6_entries("model.layers.0.mlp.down_proj", down), str(tmp_path / INT4_FILE))
    with pytest.raises(SpecchatError, match="no Q6_K LM head"):
        load(str(tmp_path), torch.bfloat16, progress=False, compact_head=True)


UNIT = 100 * 4096  # a decoder layer, a whole number of O_DIRECT pages (one ring slot)


def plan(device_units: float):
    sizes = ModelSizes(layers=(UNIT,) * 4, fixed=10 * UNIT, headroom=0, file_bytes=4 * UNIT)
    target = Target(sizes, ModelShape(2, 2, 4, 8, 16, 1, 2), compact_fixed=6 * UNIT)
    ask = Ask(contexts=(8,), drafts=(None,), tree_tokens=2, workspace=0, request=Request("disk", 0))
    return plan_memory(target, ask, Rooms(int(device_units * UNIT), None, 10**9))


def test_the_plan_keeps_the_head_compact_only_where_the_dense_one_does_not_fit():
    roomy = plan(20)
    assert not roomy.compact_head and roomy.items[0].nbytes == 10 * UNIT
    tight = plan(10)  # the smallest ring (two slots) fits beside the compact fixed parts, not the dense ones
    assert tight.compact_head and tight.items[0].nbytes == 6 * UNIT
    assert any("Q6_K" in note for note in tight.notes)
    with pytest.raises(SpecchatError, match="short"):
        plan(7)  # not even beside the compact head


def test_a_biased_q6_linear_adds_its_bias():
    linear, dense = q6_linear(32, 256, seed=4)
    biased = Q6Linear(256, 32, bias=True, dtype=torch.bfloat16)
    biased.q6_values, biased.q6_scales, biased.q6_d = linear.q6_values, linear.q6_scales, linear.q6_d
    biased.bias = torch.randn(32, dtype=torch.bfloat16)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    assert torch.equal(biased(x), linear(x) + biased.bias)


def layered_plan(device_units: float, tier: str, resident: int | None = None):
    """Four layers of one unit, or of half a unit with their Q6_K linears compact."""
    sizes = ModelSizes(layers=(UNIT,) * 4, fixed=2 * UNIT, headroom=0, file_bytes=4 * UNIT)
    compact = ModelSizes(layers=(UNIT // 2,) * 4, fixed=2 * UNIT, headroom=0, file_bytes=2 * UNIT)
    target = Target(sizes, ModelShape(2, 2, 4, 8, 16, 1, 2), compact_layers=compact)
    ask = Ask(contexts=(8,), drafts=(None,), tree_tokens=2, workspace=0, request=Request(tier, resident))
    return plan_memory(target, ask, Rooms(int(device_units * UNIT), None, 10**9))


def test_the_plan_keeps_layers_compact_where_they_stream_and_dense_where_they_are_resident():
    streamed = layered_plan(20, "disk", resident=0)
    assert streamed.compact_layers and streamed.placement.pass_bytes == 4 * (UNIT // 2)
    assert any(note.startswith("layers stream as the GGUF stores them") for note in streamed.notes)
    resident = layered_plan(20, "auto")  # every layer fits on the device either way: nothing streams
    assert not resident.compact_layers and not resident.placement.streamed
    squeezed = layered_plan(5, "auto")  # dense, one layer fits beside a 2-slot ring; compact, more do
    assert squeezed.compact_layers and squeezed.placement.pass_bytes < 3 * UNIT


def test_a_linear_smaller_than_a_chunk_expands_into_buffers_of_its_own_size():
    """The plan counts a call's buffers (offload/build.py); a 256-row v_proj sized for a whole
    chunk (then 2048 rows) held eight times what it expands, and paid its page faults on every call."""
    small, large = Q6Linear(1536, 256), Q6Linear(1536, 151936)
    row = 1536 * (4 + 2) + 1536 // 16 * 4  # float32 values, the bf16 weight, float32 scales
    assert small.workspace(torch.bfloat16) == 256 * row
    assert large.workspace(torch.bfloat16) == q6k_linear.CHUNK_WEIGHTS // 1536 * row
    assert small.workspace(torch.float32) == 256 * (1536 * 4 + 1536 // 16 * 4)  # float32: the values are the weight


class FreshStorages(TorchDispatchMode):
    """Bytes of every storage an op returns that none of its inputs held: what a call allocates."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in (t for t in tree_leaves(result) if isinstance(t, torch.Tensor)):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in inputs:
                self.seen.setdefault(storage.data_ptr(), storage.nbytes())
        return result


@pytest.mark.parametrize("dtype, widened", [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)])
def test_a_call_allocates_what_the_plan_counts(monkeypatch, dtype, widened):
    """The chunk buffers (workspace) and the rows' part (rows_workspace: a chunk's product, widened
    the float32 input too) are what a call allocates beside its output, counted from the storages
    its ops return; a 300-row prompt's product of a chunk went uncounted before."""
    monkeypatch.setattr(q6k_linear, "CHUNK_WEIGHTS", 24 * 512)  # 4 chunks of 80 rows, the last one short
    linear, _ = q6_linear(80, 512)
    linear.widened_from = 1 if widened else math.inf
    x = torch.randn(300, 512, dtype=dtype)
    with FreshStorages() as fresh:
        out = linear(x)
    allocated = sum(fresh.seen.values()) - out.untyped_storage().nbytes()
    assert allocated == linear.workspace(dtype) + q6k_linear.rows_workspace(512, 80, dtype, 300, widened)
