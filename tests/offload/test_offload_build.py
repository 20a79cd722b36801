"""Offloaded models (ram and disk tiers) compute exactly what the same model computes in memory."""

import errno
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.descriptors import held_descriptors, open_descriptors
from helpers.planned import offload_planned
from helpers.tiny import tiny_qwen_config
from transformers import Qwen2ForCausalLM

from specchat.checkpoint.layout import layout_of
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import probe_costs
from specchat.decoding.tree import DraftTree
from specchat.errors import SpecchatError
from specchat.models.loading import load
from specchat.offload.build import offload_model
from specchat.offload.direct_io import align_up, write_blob
from specchat.offload.placement import Placement
from specchat.offload.storage import TieredStore
from specchat.offload.streamed_layer import StreamedLayer, computing_modules, owner_of
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter

QUIET = Reporter(bars=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    torch.manual_seed(3)
    config = tiny_qwen_config(vocab_size=64, num_hidden_layers=5, max_position_embeddings=256, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    directory = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(directory)
    return directory


def in_memory(directory: Path) -> CausalLM:
    return CausalLM(load(str(directory), torch.float32, progress=False).model)


def offloaded(directory: Path, tier: str, tmp_path: Path, resident: int | None = 1, slots: int = 2):
    plan = PlanRequest(tier=tier, offload_dir=tmp_path / "offload", resident_layers=resident, slots=slots)
    model, offload = offload_planned(directory, "tiny", torch.float32, torch.device("cpu"), plan, QUIET)
    return CausalLM(model, offload), offload


def sequential_logits(lm: CausalLM, prompt: list[int], steps: int) -> torch.Tensor:
    cache = new_cache()
    rows, tokens = [], torch.tensor(prompt)
    for step in range(steps):
        start = len(prompt) + step - tokens.numel()
        hidden = lm.hidden(tokens, torch.arange(start, start + tokens.numel()), cache)
        rows.append(lm.logits(hidden[-1:])[0])
        tokens = rows[-1].argmax().view(1)
    return torch.stack(rows)


def tree_logits(lm: CausalLM, prompt: list[int]) -> torch.Tensor:
    parents = torch.tensor([-1, 0, 0, 1, 1, 3])
    tree = DraftTree(
        tokens=torch.tensor([5, 7, 9, 11, 3, 12]), parents=parents,
        depths=torch.tensor([0, 1, 1, 2, 2, 3]), logprobs=torch.zeros(6),
    )
    cache = new_cache()
    lm.hidden(torch.tensor(prompt), torch.arange(len(prompt)), cache)
    mask = torch.cat([torch.ones(tree.tokens.numel(), len(prompt), dtype=torch.bool), tree.ancestor_mask()], 1)
    return lm.logits(lm.hidden(tree.tokens, len(prompt) + tree.depths, cache, mask))


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_offloaded_logits_equal_in_memory(tiny_dir, tmp_path, tier):
    reference = in_memory(tiny_dir)
    lm, offload = offloaded(tiny_dir, tier, tmp_path)
    prompt = [1, 5, 9, 2, 33, 17]
    assert torch.equal(sequential_logits(lm, prompt, 6), sequential_logits(reference, prompt, 6))
    assert torch.equal(tree_logits(lm, prompt), tree_logits(reference, prompt))
    stats = lm.transfer_stats()
    assert offload.streamed == (0, 1, 2, 3) and stats.bytes > 0 and stats.transfer_s > 0  # 4 resident: spread
    offload.close()


def test_layers_are_streamed_wrappers_and_resident_ones_are_real(tiny_dir, tmp_path):
    """Two resident layers of five, spread among the streamed (offload/placement.py): 2 and 4."""
    lm, offload = offloaded(tiny_dir, "ram", tmp_path, resident=2)
    layers = lm.model.model.layers
    assert offload.streamed == (0, 1, 3)
    for index in (2, 4):
        assert not isinstance(layers[index], StreamedLayer) and not layers[index].self_attn.q_proj.weight.is_meta
    assert all(isinstance(layers[index], StreamedLayer) for index in (0, 1, 3))
    assert not any(p.is_meta for p in lm.model.parameters())
    # a pass runs the streamed layers' skeletons too, which are no submodules of the model
    computing = computing_modules(lm.model)
    assert all(layers[index].skeleton.self_attn.q_proj in computing for index in (0, 1, 3))
    assert not any(layers[0].skeleton.self_attn.q_proj is m for m in lm.model.modules())
    # code reading a layer's attributes (its attention module, say) reads the skeleton's
    assert layers[0].self_attn is layers[0].skeleton.self_attn
    offload.close()


def test_a_layer_name_that_is_no_parameter_or_buffer_is_refused_naming_it(tiny_dir):
    layer = in_memory(tiny_dir).model.model.layers[0]
    assert owner_of(layer, "self_attn.q_proj.bias") == (layer.self_attn.q_proj._parameters, "bias")
    with pytest.raises(KeyError, match=r"self_attn\.q_proj\.scale is neither a parameter nor a buffer of the layer"):
        owner_of(layer, "self_attn.q_proj.scale")


def test_bytes_per_pass_are_the_streamed_layers(tiny_dir, tmp_path):
    lm, offload = offloaded(tiny_dir, "ram", tmp_path, resident=0, slots=2)
    offload.streamer.drain()  # the ring's first loads, started at construction
    before = lm.transfer_stats()
    lm.hidden(torch.tensor([1, 2, 3]), torch.arange(3), new_cache())
    offload.streamer.drain()
    moved = lm.transfer_stats() - before
    assert moved.bytes == offload.pass_bytes  # one pass's worth: each release loads the next layer in cyclic order
    offload.close()


def test_the_probe_times_an_offloaded_pass_apart_from_its_streaming(tiny_dir, tmp_path):
    lm, offload = offloaded(tiny_dir, "disk", tmp_path, resident=1, slots=2)
    costs = probe_costs(lm, in_memory(tiny_dir), cap=4)
    assert offload.staged_share == 0.5  # 2 slots for the 4 streamed layers
    assert costs.staged == 0.5 and costs.stream_s > 0
    assert all(seconds > 0 for seconds in costs.target_s)
    offload.close()


def test_the_disk_file_is_reused_whatever_stays_resident(tiny_dir, tmp_path):
    _, first = offloaded(tiny_dir, "disk", tmp_path, resident=1)
    first.close()
    path = first.store.path
    written = path.stat().st_mtime_ns
    lm, second = offloaded(tiny_dir, "disk", tmp_path, resident=3)
    assert path.stat().st_mtime_ns == written
    reference = in_memory(tiny_dir)
    assert torch.equal(sequential_logits(lm, [4, 4, 8], 3), sequential_logits(reference, [4, 4, 8], 3))
    second.close()


def test_all_layers_resident_means_nothing_streams(tiny_dir, tmp_path):
    lm, offload = offloaded(tiny_dir, "ram", tmp_path, resident=5)
    assert offload.streamer is None and lm.transfer_stats().bytes == 0
    reference = in_memory(tiny_dir)
    assert torch.equal(sequential_logits(lm, [3, 1], 2), sequential_logits(reference, [3, 1], 2))


def test_resident_count_out_of_range_is_a_clear_error(tiny_dir, tmp_path):
    with pytest.raises(SpecchatError, match="--resident-layers must be between 0 and 5"):
        offloaded(tiny_dir, "ram", tmp_path, resident=6)


def test_a_disk_too_small_for_the_layer_file_is_one_line_before_writing(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("specchat.diskspace.shutil.disk_usage", lambda path: SimpleNamespace(free=4096))
    with pytest.raises(SpecchatError, match=r"^the model fits nowhere: 4 layers go to disk, and the layer file needs "
                                            r"0\.00 GB in .*, which has 0\.00 GB free$"):
        offloaded(tiny_dir, "disk", tmp_path)
    assert not (tmp_path / "offload").exists()  # refused by the placement, before anything was written


def test_a_disk_that_fills_up_leaves_no_partial_file_and_no_descriptor(tiny_dir, tmp_path, monkeypatch):
    writes = []

    def fill_up_on_the_third(fd, data, offset):
        writes.append(offset)
        if len(writes) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_blob(fd, data, offset)

    monkeypatch.setattr("specchat.offload.storage.write_blob", fill_up_on_the_third)
    before = held_descriptors()
    with pytest.raises(SpecchatError) as raised:
        offloaded(tiny_dir, "disk", tmp_path)
    assert str(raised.value).startswith(f"the disk holding {tmp_path / 'offload'} filled up while writing the layer file")
    assert "\n" not in str(raised.value)
    assert list((tmp_path / "offload").iterdir()) == []  # neither the partial file nor a manifest
    assert open_descriptors() == before
    monkeypatch.undo()
    lm, offload = offloaded(tiny_dir, "disk", tmp_path)  # room again: written whole, and right
    assert torch.equal(sequential_logits(lm, [4, 2], 2), sequential_logits(in_memory(tiny_dir), [4, 2], 2))
    offload.close()


def test_layers_split_between_ram_and_disk_compute_as_in_memory(tiny_dir, tmp_path):
    """The split a GPU host gets (pinned RAM, then disk), run here on the CPU's host mover."""
    plan = PlanRequest(tier="auto", offload_dir=tmp_path / "offload")
    reference = in_memory(tiny_dir)
    nbytes = layout_of(reference.model.model.layers[0]).nbytes
    placement = Placement((nbytes,) * 5, resident=1, ram=2, disk=2, slots=2, slot_bytes=align_up(nbytes), needed=0)
    model, offload = offload_model(tiny_dir, "tiny", torch.float32, torch.device("cpu"), placement, plan.offload_dir, QUIET)
    try:
        assert isinstance(offload.store, TieredStore) and offload.streamed == (0, 1, 2, 3)  # 4 resident: spread
        assert sorted(offload.store.ram.layouts) == [0, 1] and offload.store.disk.path.is_file()
        assert not offload.store.follows(1, 2) and offload.store.follows(2, 3)  # RAM then disk: one run on disk only
        lm = CausalLM(model, offload)
        prompt = [1, 5, 9, 2, 33, 17]
        assert torch.equal(sequential_logits(lm, prompt, 5), sequential_logits(reference, prompt, 5))
        assert torch.equal(tree_logits(lm, prompt), tree_logits(reference, prompt))
    finally:
        offload.close()
