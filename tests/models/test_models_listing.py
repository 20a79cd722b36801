"""`specchat models` rows: how far each model is prepared, judged from local files only."""

from dataclasses import replace
from pathlib import Path

import pytest
from helpers.gguf_files import install_part
from huggingface_hub import constants as hub_constants

from specchat.models.embedded import EMBEDDED, converted_path, gguf_path
from specchat.models.listing import HEADER, ModelRow, list_models, table_lines
from specchat.models.marker import MARKER
from specchat.models.parts import numbered_parts
from specchat.models.registry import ALIASES, DEFAULT_DRAFT, DEFAULT_TARGET

CACHED_REPO = "meta-llama/Llama-2-7b-chat-hf"


@pytest.fixture
def empty_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "specchat"))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path


def rows() -> dict[str, ModelRow]:
    return {row.alias: row for row in list_models()}


def cache_hub_repo(hub_cache: Path, repo_id: str, files: list[str]) -> Path:
    """Lay out `repo_id` as huggingface_hub's cache does: refs/main -> snapshots/<commit>/."""
    commit = "1" * 40
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in files:
        (snapshot / name).write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_one_row_per_alias(empty_caches: Path) -> None:
    listed = rows()
    assert set(listed) == set(ALIASES)
    assert listed[DEFAULT_TARGET].source == "embedded"
    assert listed["mistral-7b"].source == "mistralai/Mistral-7B-Instruct-v0.2"
    assert "target" in listed[DEFAULT_TARGET].role and "draft" in listed[DEFAULT_DRAFT].role


def test_hub_models_not_downloaded(empty_caches: Path) -> None:
    row = rows()["llama-3-8b"]
    assert (row.available, row.where) == (False, "not downloaded")


def test_hub_model_in_cache(empty_caches: Path) -> None:
    snapshot = cache_hub_repo(empty_caches / "hub", CACHED_REPO, ["config.json", "model.safetensors"])
    row = rows()["llama-2-7b"]
    assert row.available and row.where == f"HF cache: {snapshot}"


def test_hub_model_without_weights_is_incomplete(empty_caches: Path) -> None:
    cache_hub_repo(empty_caches / "hub", CACHED_REPO, ["config.json"])
    row = rows()["llama-2-7b"]
    assert not row.available and row.where.startswith("incomplete")


def test_embedded_missing_parts(empty_caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absent = numbered_parts("specchat-test-absent-part", 2, "0.0")
    monkeypatch.setitem(EMBEDDED, DEFAULT_DRAFT, replace(EMBEDDED[DEFAULT_DRAFT], parts=absent))
    row = rows()[DEFAULT_DRAFT]
    assert (row.available, row.where) == (False, "2 of 2 part packages missing")


def test_embedded_parts_installed(empty_caches: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = tmp_path / "site"
    for part in numbered_parts("specchat-test-present-part", 2, "0.0"):
        install_part(site, part, b"x")
    monkeypatch.syspath_prepend(str(site))
    present = numbered_parts("specchat-test-present-part", 2, "0.0")
    monkeypatch.setitem(EMBEDDED, DEFAULT_DRAFT, replace(EMBEDDED[DEFAULT_DRAFT], parts=present))
    assert rows()[DEFAULT_DRAFT].where == "parts installed (assembles on first use)"


def test_embedded_assembled_then_converted(empty_caches: Path) -> None:
    model = EMBEDDED[DEFAULT_TARGET]
    gguf_path(model).parent.mkdir(parents=True)
    gguf_path(model).write_bytes(b"GGUF")
    assert rows()[DEFAULT_TARGET].where.startswith(f"assembled: {gguf_path(model)}")

    converted_path(model).mkdir(parents=True)
    assert rows()[DEFAULT_TARGET].where.startswith("assembled")  # no marker yet: not complete
    (converted_path(model) / MARKER).write_text("{}")
    row = rows()[DEFAULT_TARGET]
    assert row.available and row.where == f"converted: {converted_path(model)}"


def test_the_table_lines_every_column_up_under_its_header() -> None:
    """Each column starts where its header does, however long a hub id or a role runs."""
    listed = [ModelRow("a", "embedded", "target", True, "converted: /x"),
              ModelRow("a-much-longer-alias", "someone/a-52-character-hub-id-of-the-longest-kind-xx", "draft for a",
                       False, "not downloaded")]
    header, *lines = table_lines(listed)
    starts = [header.index(name) for name in HEADER]
    assert starts == sorted(starts) and starts[0] == 0
    for line, row in zip(lines, listed):
        cells = (row.alias, row.source, row.role, "yes" if row.available else "no", row.where)
        assert [line.index(cell, start) for cell, start in zip(cells, starts)] == starts
    assert starts[2] - starts[1] == len(listed[1].source) + 2  # as wide as its widest cell, two spaces apart
