"""Model specs: aliases, local directories, .gguf files, hub ids, and the errors for everything else,
the uncached hub model offline and the pickled directory among them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from specchat.errors import SpecchatError
from specchat.models.spec import ModelSource, check_models, resolve
from specchat.models.registry import ALIASES, DEFAULT_DRAFT, DEFAULT_TARGET

HUB_ALIASES = {
    "llama-2-70b-gptq": "TheBloke/Llama-2-70B-Chat-GPTQ",
    "llama-2-70b": "meta-llama/Llama-2-70b-chat-hf",
    "llama-2-7b": "meta-llama/Llama-2-7b-chat-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama-3.1-70b-gptq": "hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b-awq": "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
    "llama-3.1-8b-awq": "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    "qwen2.5-72b-gptq": "Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "mixtral-8x7b-gptq": "TheBloke/Mixtral-8x7B-Instruct-v0.1-GPTQ",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.2",
    "qwen3-30b-a3b-gptq": "Qwen/Qwen3-30B-A3B-GPTQ-Int4",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-235b-a22b-gptq": "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
}

SRC = Path(__file__).resolve().parents[2] / "src"


def test_defaults_are_the_embedded_qwen_pair() -> None:
    assert (DEFAULT_TARGET, DEFAULT_DRAFT) == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    for alias in (DEFAULT_TARGET, DEFAULT_DRAFT):
        assert resolve(alias) == ModelSource("embedded", alias, alias)


@pytest.mark.parametrize(("alias", "hub_id"), HUB_ALIASES.items())
def test_hub_aliases(alias: str, hub_id: str) -> None:
    assert resolve(alias) == ModelSource("hub", hub_id, alias)


def test_alias_table_is_exactly_the_documented_one() -> None:
    assert set(ALIASES) == {*HUB_ALIASES, DEFAULT_TARGET, DEFAULT_DRAFT}


def test_aliases_ignore_case() -> None:
    assert resolve("Mistral-7B") == resolve("mistral-7b")


def test_hub_id() -> None:
    assert resolve("Qwen/Qwen2.5-0.5B-Instruct") == ModelSource("hub", "Qwen/Qwen2.5-0.5B-Instruct",
                                                                "Qwen/Qwen2.5-0.5B-Instruct")


def test_local_directory_needs_config_json(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    with pytest.raises(SpecchatError, match="no config.json"):
        resolve(str(model_dir))
    (model_dir / "config.json").write_text("{}")
    assert resolve(str(model_dir)) == ModelSource("dir", str(model_dir), "my-model")


def test_local_directory_wins_over_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "owner" / "name").mkdir(parents=True)
    (tmp_path / "owner" / "name" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve("owner/name").kind == "dir"


def test_gguf_file_must_exist(tmp_path: Path) -> None:
    path = tmp_path / "model.Q4_K_M.gguf"
    with pytest.raises(SpecchatError, match="GGUF file not found"):
        resolve(str(path))
    path.write_bytes(b"GGUF")
    assert resolve(str(path)) == ModelSource("gguf", str(path), "model.Q4_K_M")


@pytest.mark.parametrize("spec", ["nonsense", "a/b/c", "./not-here", "/no/such/dir", "owner/", "-x/y"])
def test_unknown_spec(spec: str) -> None:
    expected = (f"unknown model '{spec}': use an alias (see `specchat models`), a hub id, "
                "a local directory or a .gguf file")
    with pytest.raises(SpecchatError) as raised:
        resolve(spec)
    assert str(raised.value) == expected


def test_uncached_hub_model_offline_points_to_the_embedded_models(tmp_path: Path) -> None:
    # A subprocess, because huggingface_hub reads HF_HUB_OFFLINE and HF_HOME once, at import.
    script = (
        "import sys, torch\n"
        "from specchat.errors import SpecchatError\n"
        "from specchat.models.loading import load\n"
        "try:\n"
        "    load('mistral-7b', torch.float32, progress=False)\n"
        "except SpecchatError as error:\n"
        "    print(error)\n"
        "    sys.exit(2)\n"
    )
    hub_vars = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {key: value for key, value in os.environ.items() if key not in hub_vars}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(SRC))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 2, result.stderr
    message = result.stdout.strip()
    assert "\n" not in message
    assert "mistralai/Mistral-7B-Instruct-v0.2" in message
    assert "offline" in message
    assert f"{DEFAULT_TARGET} / {DEFAULT_DRAFT}" in message


def cache_config(cache: Path, repo_id: str) -> None:
    """`repo_id`'s config.json in a Hugging Face cache laid out as the hub's downloads leave it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")


def test_offline_a_hub_model_the_cache_lacks_is_one_line_before_anything_loads(tmp_path, monkeypatch) -> None:
    """Hub ids and hub aliases alike; a cached config passes, as does any model online (the
    download says the rest) and an embedded one offline."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache_config(tmp_path, "owner/cached")
    check_models(["owner/cached", DEFAULT_TARGET, DEFAULT_DRAFT], allow_pickle=False)
    for spec, repo_id in (("owner/missing", "owner/missing"), ("mistral-7b", HUB_ALIASES["mistral-7b"])):
        refusal = f"^{repo_id} is not in the local Hugging Face cache .*{DEFAULT_TARGET}"
        with pytest.raises(SpecchatError, match=refusal):
            check_models(["owner/cached", spec], allow_pickle=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    check_models(["owner/missing", "mistral-7b"], allow_pickle=False)


def test_a_directory_of_pickled_weights_alone_is_refused_unless_allowed(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(SpecchatError, match="pickled weights \\(pytorch_model.bin\\).*--allow-pickle"):
        check_models([str(tmp_path)], allow_pickle=False)
    check_models([str(tmp_path)], allow_pickle=True)
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_models([str(tmp_path)], allow_pickle=False)  # transformers reads these, not the pickle
