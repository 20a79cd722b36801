"""A .gguf file's config (models/gguf_config.py): a file that is not GGUF is one line."""

from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.models.gguf_config import gguf_config


@pytest.mark.parametrize("content", [b"", b"x", b"GGUF", b"GGUF" + bytes(60)])
def test_a_file_that_is_not_gguf_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(SpecchatError, match="model.gguf is not a readable GGUF file"):
        gguf_config(path)
