"""The disk tier's layer file (offload/storage.py): one O_DIRECT blob a layer, back to back on
aligned boundaries, private to its user, written again whenever the file and its manifest do not
say the same thing."""

import stat

import torch

from specchat.checkpoint.layout import lay_out
from specchat.offload.direct_io import ALIGN, align_up, aligned_empty
from specchat.offload.storage import DiskStore, spans

F32 = torch.float32
# Two layers of different sizes: the second's blob spans more than one boundary
LAYER_SPECS = [[("w", F32, (10,))], [("w", F32, (1500,)), ("b", F32, (3,))]]


def layer_tensors(layer: int) -> dict[str, torch.Tensor]:
    return {name: torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape) + 100 * layer
            for name, dtype, shape in LAYER_SPECS[layer]}


def written_store(path) -> DiskStore:
    store = DiskStore([lay_out(specs) for specs in LAYER_SPECS], path, {"model": "m"})
    store.begin_writing()
    for layer in store.stored_layers():
        store.write(layer, layer_tensors(layer))
    store.finish_writing()
    return store


def test_a_layer_file_holds_each_blob_on_its_boundary_and_reads_each_layer_back(tmp_path):
    store = written_store(tmp_path / "m.layers")
    sizes = [layout.nbytes for layout in store.layouts]
    assert sizes[1] > ALIGN and store.offsets == [0, align_up(sizes[0])]
    assert (tmp_path / "m.layers").stat().st_size == store.file_bytes == align_up(sizes[0]) + align_up(sizes[1])
    store.open()
    try:
        for layer, layout in enumerate(store.layouts):
            blob = store.read(layer, aligned_empty(2 * ALIGN))
            views = layout.views(blob[: layout.nbytes])
            assert all(torch.equal(views[name], tensor) for name, tensor in layer_tensors(layer).items())
    finally:
        store.close()
    assert not store.needs_writing()


def test_the_layer_file_is_its_users_alone_and_its_folder_is_made(tmp_path):
    path = tmp_path / "cache" / "model" / "m.layers"
    written_store(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a user's model weights
    assert not (tmp_path / "cache" / "model" / "m.layers.partial").exists()


def test_a_file_without_its_manifest_is_written_again(tmp_path):
    """Killed between the file's rename and the manifest's: the manifest is written last."""
    store = written_store(tmp_path / "m.layers")
    store.manifest_path.unlink()
    assert store.needs_writing()


def test_a_manifest_without_its_file_is_written_again(tmp_path):
    store = written_store(tmp_path / "m.layers")
    store.path.unlink()
    assert store.needs_writing()


def test_a_damaged_manifest_is_written_again(tmp_path):
    store = written_store(tmp_path / "m.layers")
    store.manifest_path.write_text('{"model": ')
    assert store.needs_writing()


def test_a_file_of_other_layers_is_written_again(tmp_path):
    written_store(tmp_path / "m.layers")
    other = DiskStore([lay_out(specs) for specs in LAYER_SPECS], tmp_path / "m.layers", {"model": "other"})
    assert other.needs_writing()


def test_an_abort_before_anything_was_written_leaves_nothing_and_raises_nothing(tmp_path):
    """A failed start (a disk too small, found before the partial file is opened) is aborted too."""
    store = DiskStore([lay_out(specs) for specs in LAYER_SPECS], tmp_path / "m.layers", {})
    store.abort_writing()
    assert list(tmp_path.iterdir()) == []


def test_ranges_join_where_each_starts_on_the_boundary_after_the_last_joined():
    # (0, 10) ends before ALIGN's boundary, which starts nothing here; the next two are one read
    assert spans([(0, 10), (2 * ALIGN, 2 * ALIGN + 8), (3 * ALIGN, 3 * ALIGN + 12), (5 * ALIGN, 5 * ALIGN + 1)]) == \
        [(0, 10), (2 * ALIGN, 3 * ALIGN + 12), (5 * ALIGN, 5 * ALIGN + 1)]
    assert spans([(4096, 4100), (8192, 9000), (16384, 16390)]) == [(4096, 9000), (16384, 16390)]
    assert spans([]) == []
