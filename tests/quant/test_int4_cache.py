"""PackCache: a checkpoint's packed int4 layouts, packed once per machine and read back after."""

from pathlib import Path

import psutil
import pytest
import torch

from specchat.quant import int4_cache
from specchat.quant.int4_cache import PackCache, cache_path, is_cache_file


class Packer:
    """A stand-in for int4_pack.pack: counts its calls, gives a distinct tensor each."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return torch.arange(6, dtype=torch.int32).reshape(2, 3).t() + 10 * self.calls  # not contiguous


def open_files() -> int:
    return psutil.Process().num_fds()


def test_a_module_is_packed_once_and_kept_until_saved(tmp_path):
    cache, pack = PackCache(tmp_path / "packed.safetensors"), Packer()
    first = cache.packed("layers.0.q_proj", pack)
    assert torch.equal(first, torch.tensor([[10, 13], [11, 14], [12, 15]], dtype=torch.int32))
    assert first.is_contiguous() and cache.holds("layers.0.q_proj")
    assert cache.packed("layers.0.q_proj", pack) is first and pack.calls == 1
    assert not cache.holds("layers.0.k_proj")


def test_what_was_packed_is_stored_and_read_back_without_packing(tmp_path):
    path = tmp_path / "packed.safetensors"
    cache, pack = PackCache(path), Packer()
    made = cache.packed("a", pack)
    cache.save()
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it
    assert cache.made == {}  # stored: no longer held in memory too
    again = PackCache(path)
    assert again.holds("a") and torch.equal(again.packed("a", pack), made) and pack.calls == 1
    more = again.packed("b", pack)
    again.save()  # the stored "a" with the new "b"
    third = PackCache(path)
    assert torch.equal(third.packed("a", pack), made) and torch.equal(third.packed("b", pack), more)
    assert pack.calls == 2


def test_after_saving_what_is_packed_is_not_kept(tmp_path):
    cache, pack = PackCache(tmp_path / "packed.safetensors"), Packer()
    cache.save()
    assert not (tmp_path / "packed.safetensors").exists()  # nothing packed: nothing written
    cache.packed("late", pack)
    assert not cache.holds("late") and cache.made == {}
    cache.packed("late", pack)
    assert pack.calls == 2


def test_a_failed_save_leaves_the_stored_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "packed.safetensors"
    cache = PackCache(path)
    cache.packed("a", Packer())
    cache.save()
    stored = path.read_bytes()
    cache = PackCache(path)
    cache.packed("b", Packer())
    written = []

    def fail(tensors: dict, filename: str) -> None:
        written.append(Path(filename))
        written[0].write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(int4_cache, "save_file", fail)
    files = open_files()
    with pytest.raises(OSError, match="disk full"):
        cache.save()
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == stored
    # written beside it (os.replace is atomic within a file system), hidden, and told from a checkpoint
    assert written[0].parent == tmp_path and written[0].name.startswith(".packed.safetensors.")
    assert written[0].suffix == ".tmp"
    assert open_files() == files  # the temporary file's descriptor closed


def test_the_cache_is_named_by_its_kernels_layout_and_told_from_the_checkpoints_files(tmp_path, monkeypatch):
    cpu, cuda = cache_path(tmp_path, "cpu"), cache_path(tmp_path, "cuda")
    assert cpu.parent == tmp_path and cpu != cuda and cpu.suffix == ".safetensors"
    assert cpu == cache_path(tmp_path, "cpu") and is_cache_file(cpu) and is_cache_file(cuda)
    assert not is_cache_file(tmp_path / "model.safetensors")
    monkeypatch.setattr(int4_cache, "layout_key", lambda device_type: f"{device_type}, another torch")
    assert cache_path(tmp_path, "cpu") != cpu  # another machine's layout: a file of its own
