"""checkpoint/sources.py: a checkpoint's tensors read one at a time from its safetensors shards, by
the names the model gives them, and what identifies its files; checkpoint/layer_file.py: the layer
file a model's streamed layers are written to, named and fingerprinted from them."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from specchat.checkpoint.layer_file import fingerprint, layer_file
from specchat.checkpoint.sources import SafetensorsSource, keep_packed, pack_cache
from specchat.errors import SpecchatError
from specchat.quant.int4_cache import cache_path
from specchat.quant.int4_checkpoint import INT4_FILE
from specchat.quant.int4_pack import layout_key

GATE = "model.layers.0.block_sparse_moe.gate.weight"
EXPERT = "model.layers.0.block_sparse_moe.experts.1.w2.weight"
CONFIG = {"model_type": "mixtral", "hidden_size": 4}


@pytest.fixture
def sharded(tmp_path):
    """A Mixtral-named checkpoint in two shards."""
    save_file({GATE: torch.arange(8.0).reshape(2, 4)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({EXPERT: torch.ones(4, 3, dtype=torch.bfloat16), "lm_head.weight": torch.zeros(5, 4)},
              tmp_path / "model-00002-of-00002.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def test_every_shards_tensors_are_read_by_the_models_names(sharded):
    source = SafetensorsSource(sharded)
    assert sorted(source.names()) == ["lm_head.weight", "model.layers.0.mlp.experts.1.down_proj.weight",
                                      "model.layers.0.mlp.gate.weight"]
    assert torch.equal(source.get("model.layers.0.mlp.gate.weight"), torch.arange(8.0).reshape(2, 4))
    expert = source.get("model.layers.0.mlp.experts.1.down_proj.weight")
    assert expert.dtype == torch.bfloat16 and torch.equal(expert, torch.ones(4, 3, dtype=torch.bfloat16))
    assert source.shape("model.layers.0.mlp.experts.1.down_proj.weight") == [4, 3]
    assert source.shape("lm_head.weight") == [5, 4]


def test_a_name_the_checkpoint_lacks_is_one_line(sharded):
    source = SafetensorsSource(sharded)
    for read in (source.get, source.shape):
        with pytest.raises(SpecchatError, match=f"the checkpoint in {sharded} has no tensor '{GATE}'$"):
            read(GATE)  # stored under that name, read under the model's


def test_a_directory_without_safetensors_is_one_line(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(SpecchatError, match="has no .safetensors files: offloading reads safetensors checkpoints"):
        SafetensorsSource(tmp_path)


def test_the_fingerprint_changes_with_a_shards_contents_and_with_the_config(sharded):
    before = SafetensorsSource(sharded).fingerprint()
    assert before["config"] == CONFIG and [entry[0] for entry in before["files"]] == \
        [str(sharded / f"model-0000{i}-of-00002.safetensors") for i in (1, 2)]
    assert SafetensorsSource(sharded).fingerprint() == before  # read again, unchanged
    shard = sharded / "model-00001-of-00002.safetensors"
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten in place: only its time moves
    assert SafetensorsSource(sharded).fingerprint() != before
    (sharded / "config.json").write_text(json.dumps(CONFIG | {"hidden_size": 8}))
    assert SafetensorsSource(sharded).fingerprint()["config"]["hidden_size"] == 8


def test_only_an_embedded_conversion_keeps_its_packed_weights_beside_it_and_not_among_its_files(sharded):
    """The pack cache is written after the first load: among the checkpoint's files it would change
    their fingerprint, so that the next run rewrote a layer file of the same bytes, and add its
    module names to the checkpoint's."""
    assert pack_cache(sharded, torch.device("cpu")) is None  # a GPTQ or dense checkpoint
    save_file({"model.layers.0.mlp.down_proj.qweight": torch.zeros(2, dtype=torch.uint8)}, sharded / INT4_FILE)
    cache = pack_cache(sharded, torch.device("cpu"))
    assert cache.path == cache_path(sharded, "cpu") and not cache.holds("model.layers.0.mlp.down_proj")
    before = SafetensorsSource(sharded, cache)
    names, identity = sorted(before.names()), before.fingerprint()
    cache.packed("model.layers.0.mlp.down_proj", lambda: torch.arange(4, dtype=torch.int32))
    keep_packed(before)
    kept = pack_cache(sharded, torch.device("cpu"))
    assert kept.holds("model.layers.0.mlp.down_proj") and not cache.collecting  # later packs go to the layer file
    after = SafetensorsSource(sharded, kept)
    assert sorted(after.names()) == names and after.fingerprint() == identity


def test_a_layer_file_is_named_by_the_model_and_dtype_in_the_offload_dir(tmp_path):
    assert layer_file(tmp_path, "qwen2.5-coder-1.5b", torch.bfloat16) == tmp_path / "qwen2.5-coder-1.5b-bfloat16.layers"
    # a path or a name with spaces or slashes becomes one file name
    assert layer_file(tmp_path, "/home/me/My Models/llama", torch.float32) == \
        tmp_path / "_home_me_My_Models_llama-float32.layers"


def test_a_layer_files_bytes_depend_on_the_checkpoint_the_dtype_and_the_devices_int4_layout(sharded):
    source = SafetensorsSource(sharded)
    cpu = fingerprint(source, torch.bfloat16, torch.device("cpu"))
    assert cpu == {**source.fingerprint(), "dtype": "torch.bfloat16", "int4 layout": layout_key("cpu")}
    assert fingerprint(source, torch.bfloat16, torch.device("cuda"))["int4 layout"] == layout_key("cuda") != \
        cpu["int4 layout"]
    assert fingerprint(source, torch.float32, torch.device("cpu"))["dtype"] == "torch.float32"
