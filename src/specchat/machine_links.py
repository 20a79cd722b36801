"""The offload links' speeds as `specchat doctor` last measured them on this machine, kept in the
user cache so the loading screen can tell how long a streamed pass will take. A fact of the
machine, beside its memory (memory_room.py) and its kept choices (machine_choices.py): any room
may read it."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specchat.paths import probe_dir


@dataclass(frozen=True)
class Links:
    ram_gbps: float | None = None  # pinned RAM -> GPU (None without CUDA or not measured)
    disk_gbps: float | None = None  # uncached reads in the offload directory


def links_path() -> Path:
    return probe_dir() / "links.json"


def save_links(links: Links) -> None:
    path = links_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(asdict(links)))
    temp.replace(path)


def read_links() -> Links:
    """The last measured speeds; unknown (None) when doctor has not run or its file is damaged."""
    try:
        return Links(**json.loads(links_path().read_text()))
    except (OSError, ValueError, TypeError):
        return Links()
