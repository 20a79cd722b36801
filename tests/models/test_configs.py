"""A model directory's config.json as transformers reads it (models/configs.py): what is not a
config is one line, never transformers' or json's traceback, whichever command reads it first."""

from pathlib import Path

import pytest
from helpers.cli import CORPUS, save_tiny_model

from specchat.errors import SpecchatError
from specchat.models.configs import config_from_file
from specchat.models.local import local_tokenizer


@pytest.mark.parametrize(("content", "fragment"), [
    (b"[]", "its JSON is not an object"),  # was a TypeError in the tokenizer's loader
    (b"5", "its JSON is not an object"),  # was "argument of type 'int' is not iterable"
    (b'{"model_type": "qwen2"', "cannot read the model config"),
    (b"\xff\xfe", "cannot read the model config"),  # was a UnicodeDecodeError
])
def test_a_config_that_is_not_one_is_one_line(tmp_path: Path, content: bytes, fragment: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(SpecchatError, match=fragment):
        config_from_file(tmp_path / "config.json")


def test_generate_reads_a_directorys_config_before_its_tokenizer(tmp_path: Path) -> None:
    directory = save_tiny_model(tmp_path / "tiny", CORPUS, seed=0)
    assert local_tokenizer(str(directory)) is not None
    (directory / "config.json").write_text("[]")
    with pytest.raises(SpecchatError, match="its JSON is not an object"):
        local_tokenizer(str(directory))
