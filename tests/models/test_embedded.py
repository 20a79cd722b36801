"""An embedded model run from its 4-bit weights (`weights` quantized): its 4-bit conversion built
beside the dense one, once, an incomplete one replaced, its progress reported, no room on disk one
line that keeps the dense conversion, the room asked for exactly the bytes written; a caller that
finds another process preparing the model or packing it says so and waits for it, and the packing
holds a lock of its own. Assembling and the dense conversion are test_models_gguf.py's."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from filelock import FileLock, Timeout
from helpers.disk_full import disk_full
from helpers.gguf_files import fake_draft, tiny_gguf  # noqa: F401 (fixtures)
from helpers.gguf_q4km_writer import fake_q4km_draft  # noqa: F401 (a fixture)
from safetensors import safe_open

from specchat.errors import SpecchatError
from specchat.models import convert_int4, embedded
from specchat.models.embedded import EmbeddedModel, converted_path, ensure_embedded, int4_path, lock_path
from specchat.models.marker import is_converted, is_current_int4
from specchat.models.registry import DEFAULT_DRAFT
from specchat.quant.int4_checkpoint import INT4_FILE


def refuse_to_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(model: EmbeddedModel, reporter: object) -> None:
        raise AssertionError(f"{model.name} built again")

    monkeypatch.setattr(embedded, "build", refuse)
    monkeypatch.setattr(embedded, "build_int4", refuse)


def test_quantized_weights_are_converted_beside_the_dense_conversion_once(fake_q4km_draft, monkeypatch):
    directory = ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized")
    assert directory == int4_path(fake_q4km_draft) != converted_path(fake_q4km_draft)
    assert is_current_int4(directory) and (directory / INT4_FILE).is_file()
    assert is_converted(converted_path(fake_q4km_draft))  # what the 4-bit one links its other tensors to
    refuse_to_build(monkeypatch)
    assert ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized") == directory
    assert ensure_embedded(DEFAULT_DRAFT, progress=False) == converted_path(fake_q4km_draft)


def test_the_4bit_conversion_is_added_to_a_dense_one_already_there(fake_q4km_draft, monkeypatch):
    dense = ensure_embedded(DEFAULT_DRAFT, progress=False)
    made = dense.stat().st_mtime_ns
    monkeypatch.setattr(embedded, "build", lambda model, reporter: pytest.fail("the dense conversion built again"))
    assert is_current_int4(ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized"))
    assert dense.stat().st_mtime_ns == made


def test_an_incomplete_4bit_conversion_and_its_leftovers_are_replaced(fake_q4km_draft):
    ensure_embedded(DEFAULT_DRAFT, progress=False)
    directory = int4_path(fake_q4km_draft)
    directory.mkdir()  # no marker: an interrupted conversion
    (directory / INT4_FILE).write_bytes(b"partial")
    (directory.parent / f".{directory.name}.crashed").mkdir()
    assert ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized") == directory
    assert is_current_int4(directory) and (directory / INT4_FILE).stat().st_size > len(b"partial")
    assert sorted(path.name for path in directory.parent.iterdir()) == ["tiny", directory.name]


def test_packing_in_4_bits_reports_its_progress_up_to_the_end(fake_q4km_draft):
    calls: list[tuple[str, float | None]] = []
    ensure_embedded(DEFAULT_DRAFT, False, lambda step, fraction: calls.append((step, fraction)), weights="quantized")
    fractions = [fraction for step, fraction in calls if step == "packing tiny in 4 bits"]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0 and fractions == sorted(fractions)


@pytest.mark.parametrize("stage", ["before", "while writing"])
def test_no_room_for_the_4bit_conversion_is_one_line_and_keeps_the_dense_one(fake_q4km_draft, monkeypatch, stage):
    dense = ensure_embedded(DEFAULT_DRAFT, progress=False)
    if stage == "before":
        monkeypatch.setattr("specchat.diskspace.shutil.disk_usage", lambda path: SimpleNamespace(free=100))
        words = r"^not enough space in .* for the 4-bit tiny: it needs .* GB, 0\.00 GB are free$"
    else:
        monkeypatch.setattr(convert_int4, "save_file", disk_full)
        words = r"filled up while writing .*: it needs .* GB free$"
    with pytest.raises(SpecchatError, match=words):
        ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized")
    assert [path.name for path in dense.parent.iterdir()] == [dense.name] and is_converted(dense)


def test_the_4bit_conversion_asks_for_the_bytes_of_the_tensors_it_writes(fake_q4km_draft, monkeypatch):
    directory = ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized")
    with safe_open(str(directory / INT4_FILE), "pt") as stored:
        written = sum(stored.get_tensor(name).nbytes for name in stored.keys())
    shutil.rmtree(directory)
    monkeypatch.setattr("specchat.diskspace.shutil.disk_usage", lambda path: SimpleNamespace(free=written - 1))
    with pytest.raises(SpecchatError, match="not enough space"):
        ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized")
    monkeypatch.setattr("specchat.diskspace.shutil.disk_usage", lambda path: SimpleNamespace(free=written))
    assert is_current_int4(ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized"))


def test_a_caller_says_it_waits_for_another_process_preparing_the_model(fake_draft):  # noqa: F811
    """The lock is held as another process holds it (its own lock on the file) until the caller says it
    waits; then it is let go, and the caller goes on to prepare the model."""
    path = lock_path(fake_draft.name)
    path.parent.mkdir(parents=True)
    held = FileLock(path)
    held.acquire()
    steps: list[str] = []

    def report(step: str, fraction: float | None) -> None:
        if not steps:  # the first word: nothing prepared yet while the lock is held
            assert not converted_path(fake_draft).parent.exists()
            held.release()
        steps.append(step)

    try:
        assert ensure_embedded(DEFAULT_DRAFT, False, report) == converted_path(fake_draft)
    finally:
        if held.is_locked:
            held.release()
    assert steps[0] == f"waiting for another specchat process to prepare {DEFAULT_DRAFT}..."
    assert is_converted(converted_path(fake_draft))


def free(path: Path) -> bool:
    """Whether another holder (as another process would) takes the lock at `path` at once."""
    other = FileLock(path)
    try:
        other.acquire(timeout=0)
    except Timeout:
        return False
    other.release()
    return True


def test_the_4bit_packing_holds_its_own_lock_and_leaves_the_dense_one_to_others(fake_q4km_draft, monkeypatch):
    """While one process packs the 4-bit weights, another that needs only the dense conversion (a
    float32 target) takes its lock at once: the dense lock is not held through the packing."""
    pack = embedded.build_int4
    held: list[tuple[bool, bool]] = []

    def packing(model: EmbeddedModel, reporter: object) -> None:
        held.append((free(lock_path(model.name)), free(lock_path(f"{model.name}-int4"))))
        pack(model, reporter)

    monkeypatch.setattr(embedded, "build_int4", packing)
    assert is_current_int4(ensure_embedded(DEFAULT_DRAFT, progress=False, weights="quantized"))
    assert held == [(True, False)]


def test_a_caller_says_it_waits_for_another_process_packing_in_4_bits(fake_q4km_draft):
    dense = ensure_embedded(DEFAULT_DRAFT, progress=False)
    held = FileLock(lock_path(f"{fake_q4km_draft.name}-int4"))
    held.acquire()
    steps: list[str] = []

    def report(step: str, fraction: float | None) -> None:
        if not steps:  # the first word: nothing packed yet while the lock is held
            assert not int4_path(fake_q4km_draft).exists()
            held.release()
        steps.append(step)

    try:
        assert ensure_embedded(DEFAULT_DRAFT, False, report, weights="quantized") == int4_path(fake_q4km_draft)
    finally:
        if held.is_locked:
            held.release()
    assert steps[0] == f"waiting for another specchat process to pack {DEFAULT_DRAFT} in 4 bits..."
    assert is_converted(dense) and is_current_int4(int4_path(fake_q4km_draft))
