"""What `specchat models` shows: every alias, and whether it can be used without downloading."""

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from specchat.models.embedded import EMBEDDED, EmbeddedModel, converted_path, gguf_path
from specchat.models.marker import is_converted
from specchat.models.parts import missing_parts
from specchat.models.registry import ALIASES, Alias

HEADER = ("ALIAS", "SOURCE", "ROLE", "LOCAL", "WHERE")  # `specchat models`' columns


@dataclass(frozen=True)
class ModelRow:
    alias: str
    source: str  # hub id, or "embedded"
    role: str
    available: bool  # usable without network
    where: str  # how far it is prepared, and where


def list_models() -> list[ModelRow]:
    """One row per alias; looks only at local files, never at the network."""
    return [row(alias) for alias in ALIASES.values()]


def row(alias: Alias) -> ModelRow:
    if alias.hub_id is None:
        available, where = embedded_status(EMBEDDED[alias.name])
    else:
        available, where = hub_status(alias.hub_id)
    return ModelRow(alias.name, alias.hub_id or "embedded", alias.role, available, where)


def embedded_status(model: EmbeddedModel) -> tuple[bool, str]:
    directory = converted_path(model)
    if is_converted(directory):
        return True, f"converted: {directory}"
    gguf = gguf_path(model)
    if gguf.is_file():
        return True, f"assembled: {gguf} (converts on first use)"
    missing = missing_parts(model.parts)
    if not missing:
        return True, "parts installed (assembles on first use)"
    return False, f"{len(missing)} of {len(model.parts)} part packages missing"


def hub_status(repo_id: str) -> tuple[bool, str]:
    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):  # None or a "known missing" sentinel
        return False, "not downloaded"
    snapshot = Path(config).parent
    if not any(snapshot.glob("*.safetensors")):
        return False, f"incomplete (no weights): {snapshot}"
    return True, f"HF cache: {snapshot}"


def table_lines(rows: list[ModelRow]) -> list[str]:
    """`specchat models`' table: a header, then a row per alias, each column as wide as its widest
    cell (hub ids run from 8 to 52 characters) and the last one left ragged."""
    cells = [HEADER, *((r.alias, r.source, r.role, "yes" if r.available else "no", r.where) for r in rows)]
    widths = [max(len(line[column]) for line in cells) for column in range(len(HEADER) - 1)]
    return ["  ".join([*(cell.ljust(width) for cell, width in zip(line, widths)), line[-1]]).rstrip()
            for line in cells]
