"""/file's block (tui/attach.py): the file fenced under its name in its language, a fence longer
than any backtick run inside so the block ends where the file does, one line for what cannot be
attached, and Tab's path candidates."""

import pytest
from markdown_it import MarkdownIt

from specchat.errors import SpecchatError
from specchat.tui.attach import MAX_BYTES, MAX_CANDIDATES, attached_file, language, path_candidates


@pytest.mark.parametrize("name, info", [("prime.py", "python"), ("main.rs", "rust"), ("Makefile", "make"),
                                        ("notes.md", "markdown"), ("data.specchat-unknown", "")])
def test_the_fence_names_the_language_markdown_renderers_read(tmp_path, name, info):
    assert language(tmp_path / name) == info


def test_the_block_holds_the_file_whole_and_counts_its_lines(tmp_path):
    path = tmp_path / "prime.py"
    path.write_text("def is_prime(n):\n    return n > 1")  # no newline at the end: the fence still closes
    attached = attached_file(path)
    assert attached.text == f"`{path}`:\n```python\ndef is_prime(n):\n    return n > 1\n```\n"
    assert (attached.name, attached.lines) == (str(path), 2)


def test_a_file_with_fences_of_its_own_stays_one_block(tmp_path):
    """A markdown file holding ``` and ```` blocks: the attached block is one code block whose text
    is the whole file, as CommonMark (rich's markdown-it) parses it."""
    content = "# Usage\n\n```bash\nspecchat run\n```\n\n````text\nfour\n````\n"
    path = tmp_path / "README.md"
    path.write_text(content)
    attached = attached_file(path)
    fences = [token for token in MarkdownIt().parse(attached.text) if token.type == "fence"]
    assert [(token.info, token.content) for token in fences] == [("markdown", content)]


@pytest.mark.parametrize("make, why", [
    (lambda tmp: tmp, "a directory, not a file"),
    (lambda tmp: tmp / "missing.py", "No such file or directory"),
    (lambda tmp: write(tmp / "image.png", b"\x89PNG\r\n\x1a\n\xff\xfe"), "not UTF-8 text"),
    (lambda tmp: write(tmp / "huge.log", b"x" * (MAX_BYTES + 1)), "larger than 1 MB, too large to attach"),
])
def test_what_cannot_be_attached_is_one_line_naming_the_file(tmp_path, make, why):
    path = make(tmp_path)
    with pytest.raises(SpecchatError) as error:
        attached_file(path)
    assert str(error.value) == f"/file {path}: {why}"


def test_a_file_of_exactly_the_limit_is_attached(tmp_path):
    path = write(tmp_path / "full.txt", b"y" * (MAX_BYTES - 1) + b"\n")
    assert attached_file(path).lines == 1


def test_tab_completes_paths_folders_with_a_slash_hidden_ones_when_asked(tmp_path):
    (tmp_path / "app.py").write_text("")
    (tmp_path / "apps").mkdir()
    (tmp_path / ".apprc").write_text("")
    (tmp_path / "other.py").write_text("")
    assert path_candidates(f"{tmp_path}/ap") == [f"{tmp_path}/app.py", f"{tmp_path}/apps/"]
    assert path_candidates(f"{tmp_path}/.ap") == [f"{tmp_path}/.apprc"]
    assert path_candidates(f"{tmp_path}/missing/a") == []


def test_tab_lists_at_most_a_hint_lines_worth(tmp_path):
    for index in range(MAX_CANDIDATES + 5):
        (tmp_path / f"f{index:03}.txt").write_text("")
    assert path_candidates(f"{tmp_path}/f") == [f"{tmp_path}/f{index:03}.txt" for index in range(MAX_CANDIDATES)]


def write(path, data: bytes):
    path.write_bytes(data)
    return path
