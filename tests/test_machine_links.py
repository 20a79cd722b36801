"""machine_links.py: doctor's measured link speeds kept in the probe folder, read back whole or not at all."""

import json

import pytest

from specchat.machine_links import Links, links_path, read_links, save_links


@pytest.fixture
def fresh_probe_dir(tmp_path, monkeypatch):
    """A probe folder that does not exist yet, as on a machine where nothing was measured."""
    directory = tmp_path / "cache" / "probes"
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(directory))
    return directory


def test_saved_speeds_are_read_back_from_a_folder_the_save_made(fresh_probe_dir):
    save_links(Links(ram_gbps=24.5, disk_gbps=1.3))
    assert read_links() == Links(ram_gbps=24.5, disk_gbps=1.3)
    assert links_path() == fresh_probe_dir / "links.json"
    assert [path.name for path in fresh_probe_dir.iterdir()] == ["links.json"]  # no temporary file left


def test_a_second_save_replaces_the_first(fresh_probe_dir):
    save_links(Links(ram_gbps=24.5, disk_gbps=1.3))
    save_links(Links(disk_gbps=2.0))
    assert read_links() == Links(ram_gbps=None, disk_gbps=2.0)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"ram_gbps": 1.0, "lanes": 16}), json.dumps([1.0, 2.0])])
def test_a_damaged_file_reads_as_unmeasured(fresh_probe_dir, text):
    fresh_probe_dir.mkdir(parents=True)
    links_path().write_text(text)
    assert read_links() == Links()


def test_no_file_reads_as_unmeasured(fresh_probe_dir):
    assert read_links() == Links(ram_gbps=None, disk_gbps=None)


def test_the_speeds_are_frozen():
    with pytest.raises(AttributeError):
        Links().disk_gbps = 1.0
