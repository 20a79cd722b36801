"""staging.py: temporary siblings of a final path, made in a folder that may not exist yet, and
found again by a later run (and only they)."""

import os

from specchat.models.staging import leftovers, new_temp_dir, new_temp_file


def test_a_temporary_file_is_a_hidden_sibling_made_with_its_folders(tmp_path):
    final = tmp_path / "cache" / "models" / "target.gguf"
    fd, temp = new_temp_file(final)
    os.write(fd, b"partial")
    os.close(fd)
    assert temp.parent == final.parent and temp.read_bytes() == b"partial"
    assert temp.name.startswith(".target.gguf.") and temp.name.endswith(".tmp")
    assert not final.exists()


def test_a_temporary_folder_is_a_hidden_sibling_made_with_its_folders(tmp_path):
    final = tmp_path / "cache" / "converted" / "target"
    temp = new_temp_dir(final)
    assert temp.is_dir() and temp.parent == final.parent and temp.name.startswith(".target.")
    assert not final.exists()


def test_leftovers_are_the_siblings_of_that_final_path_alone(tmp_path):
    final = tmp_path / "models" / "target.gguf"
    fd, first = new_temp_file(final)
    os.close(fd)
    second = new_temp_dir(final)
    fd, _ = new_temp_file(final.with_name("draft.gguf"))  # another output's
    os.close(fd)
    final.write_bytes(b"done")
    assert leftovers(final) == sorted([first, second])


def test_no_folder_has_no_leftovers(tmp_path):
    assert leftovers(tmp_path / "missing" / "target.gguf") == []
