"""A target's input embedding held on the host beside a GPU (offload/host_embedding.py): it looks
up what the embedding looked up, moving the model leaves it on the host, the plan holds it there
for an untied target on CUDA only, and the loader puts it there when the plan says so."""

from dataclasses import replace

import pytest
import torch
from helpers.cli import tiny_dirs  # noqa: F401 (a fixture)
from helpers.plan_sizes import gpu_plan
from helpers.tiny import tiny_qwen_config
from transformers import Qwen2ForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.engine_options import EngineOptions
from specchat.host_pull import HostSender
from specchat.loader import load_target, plan_run
from specchat.offload.host_embedding import HostEmbedding, keep_embedding_on_host
from specchat.plan import resolve_weights
from specchat.plan.budget import FIXED, Item
from specchat.plan.sizes import host_embedding_bytes
from specchat.progress import Reporter

CPU = torch.device("cpu")
PROMPT = torch.tensor([3, 14, 15, 9, 26])


def hidden(model) -> torch.Tensor:
    lm = CausalLM(model)
    return lm.hidden(PROMPT, torch.arange(PROMPT.numel()), new_cache())


def test_it_looks_up_what_the_embedding_did_and_moving_the_model_leaves_it_on_the_host():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=False)).eval()
    before = hidden(model)
    table = model.get_input_embeddings().weight
    keep_embedding_on_host(model, CPU, torch.float32)
    assert isinstance(model.get_input_embeddings(), HostEmbedding)
    assert torch.equal(hidden(model), before)
    model.to("meta")  # what moving to a GPU does to every registered tensor
    assert model.device.type == "meta"  # transformers reads the anchor: where the rows go
    assert model.get_input_embeddings().table.weight is table and table.device == CPU


def test_its_rows_go_through_a_sender_made_for_the_ids_device():
    """Beside a GPU the sender pulls the rows (host_pull.py); it is made for the first ids' device
    and made again for ids on another."""
    embedding = HostEmbedding(torch.nn.Embedding(50, 8), CPU, torch.float32)
    ids = torch.tensor([[4, 9, 4]])
    rows = embedding(ids)
    assert torch.equal(rows, embedding.table(ids)) and embedding.sender.device == CPU
    first = embedding.sender
    embedding(torch.tensor([[1]]))
    assert embedding.sender is first
    embedding.sender = HostSender(torch.device("meta"))  # made for ids elsewhere
    embedding(torch.tensor([[1]]))
    assert embedding.sender.device == CPU


@pytest.mark.parametrize("tied", [False, True])
def test_the_plan_holds_an_untied_embedding_on_the_host_beside_a_gpu(tied):
    with torch.device("meta"):
        model = Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=tied))
    assert host_embedding_bytes(model, torch.bfloat16) == (0 if tied else 50 * 32 * 2)  # bf16 rows of the vocabulary
    memory = gpu_plan("llama-3.1-70b-awq", "llama-3.1-8b-awq", 24, 64)
    assert memory.embedding_on_host  # 128256 x 8192 bf16 rows: 2.1 GB for resident layers instead


def test_the_embedded_target_keeps_its_embedding_on_a_cpu():
    options = resolve_weights(EngineOptions())
    assert not plan_run(options, CPU, True, Reporter(bars=False)).embedding_on_host


@pytest.mark.parametrize("offload", ["none", "disk"], ids=["in-memory", "streamed"])
def test_the_loader_holds_the_targets_embedding_on_the_host_where_the_plan_does(tiny_dirs, tmp_path,  # noqa: F811
                                                                               offload):
    target_dir = tiny_dirs[0]
    options = resolve_weights(EngineOptions(target=str(target_dir), dtype="float32", offload=offload,
                                            offload_dir=str(tmp_path), resident_layers=0 if offload == "disk" else None))
    memory = plan_run(options, CPU, False, Reporter(bars=False))
    plain, plain_offload = load_target(options, CPU, torch.float32, memory, Reporter(bars=False))
    hosted = replace(memory, items=(*memory.items, Item("host", f"{FIXED}: the input embedding", 1)))
    target, offload_ = load_target(options, CPU, torch.float32, hosted, Reporter(bars=False))
    try:
        assert bool(memory.placement.streamed) == (offload == "disk")
        assert isinstance(target.model.get_input_embeddings(), HostEmbedding)
        assert not isinstance(plain.model.get_input_embeddings(), HostEmbedding)
        rows = [CausalLM(model, each).hidden(PROMPT, torch.arange(PROMPT.numel()), new_cache())
                for model, each in ((plain.model, plain_offload), (target.model, offload_))]
        assert torch.equal(rows[0], rows[1])
    finally:
        for each in (plain_offload, offload_):
            if each is not None:
                each.close()
