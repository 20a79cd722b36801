"""The README's "model code from a repository is never run", end to end: a model repository whose
config and tokenizer point (`auto_map`) at Python files that leave a marker and raise when
imported. Loaded from a local directory or from the Hub, specchat builds the model from
transformers' own classes and never imports them; a model type only such code could build is
refused in one line."""

import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import CORPUS, assert_one_line_error, run_cli, save_tiny_model
from huggingface_hub.utils import filter_repo_objects

MODULES = ("configuration_planted", "modeling_planted", "tokenization_planted")
AUTO_MAP = {"AutoConfig": "configuration_planted.PlantedConfig",
            "AutoModelForCausalLM": "modeling_planted.PlantedForCausalLM"}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_planted.PlantedTokenizer", None]}
GENERATE = ["--raw", "--json", "--engine", "autoregressive", "--dtype", "float32", "--max-new-tokens", "4"]


def plant_code(directory: Path, marker: Path) -> None:
    """The repository's own code, named by its config and tokenizer config: importing any of it
    writes `marker` and fails."""
    for module in MODULES:
        (directory / f"{module}.py").write_text(
            f"from pathlib import Path\nPath({str(marker)!r}).write_text(__name__)\n"
            "raise RuntimeError('a repository module was imported')\n")
    edit_json(directory / "config.json", auto_map=AUTO_MAP)
    edit_json(directory / "tokenizer_config.json", auto_map=TOKENIZER_AUTO_MAP)


def edit_json(path: Path, **values: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "repository-code-ran"


@pytest.fixture
def repository(tmp_path, marker) -> Path:
    """A tiny Qwen2 (a type transformers knows) with code of its own beside it."""
    directory = save_tiny_model(tmp_path / "planted", CORPUS, seed=0)
    plant_code(directory, marker)
    return directory


@pytest.fixture
def hub(monkeypatch, tmp_path, repository) -> str:
    """The Hub replaced by `repository`: a snapshot holds the files the download's patterns let
    through, filtered as huggingface_hub filters them. Returns the repository's hub id."""
    def snapshot_download(repo_id: str, allow_patterns: list[str], tqdm_class: object) -> str:
        snapshot = tmp_path / "snapshot"
        snapshot.mkdir(exist_ok=True)
        for name in filter_repo_objects([path.name for path in repository.iterdir()], allow_patterns=allow_patterns):
            shutil.copy(repository / name, snapshot / name)
        return str(snapshot)

    monkeypatch.setattr("specchat.models.hub.snapshot_download", snapshot_download)
    monkeypatch.setattr("specchat.models.hub.hf_hub_download", lambda repo_id, name: str(repository / name))
    return "someone/planted-model"


def test_a_local_directory_loads_without_running_its_code(monkeypatch, capsys, repository, marker):
    code, out, err = run_cli(monkeypatch, capsys, "generate", "hello world", "--target", str(repository), *GENERATE)
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 4
    assert not marker.exists()


def test_a_hub_repository_loads_without_fetching_or_running_its_code(monkeypatch, capsys, hub, tmp_path, marker):
    code, out, err = run_cli(monkeypatch, capsys, "generate", "hello world", "--target", hub, *GENERATE)
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 4
    assert not marker.exists()
    assert not list((tmp_path / "snapshot").glob("*.py"))  # the download leaves the code behind


def test_a_model_type_only_its_code_could_build_is_refused_in_one_line(monkeypatch, capsys, repository, marker):
    edit_json(repository / "config.json", model_type="planted", architectures=["PlantedForCausalLM"])
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hello world", "--target", str(repository), *GENERATE)
    assert_one_line_error(code, err, "model type 'planted'", "never runs a repository's own model code")
    assert not marker.exists()
