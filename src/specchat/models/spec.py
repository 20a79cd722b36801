"""What a model spec (alias, local directory, .gguf file or hub id) names, checked without torch:
the command line answers a spec that cannot load here before anything heavy is imported."""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from huggingface_hub import constants, try_to_load_from_cache

from specchat.errors import SpecchatError
from specchat.paths import expanded
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, find_alias

SourceKind = Literal["embedded", "hub", "dir", "gguf"]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    location: str  # alias (embedded), hub id (hub), or absolute path (dir, gguf)
    name: str  # shown to the user


def resolve(spec: str) -> ModelSource:
    """What `spec` names, checked as far as possible without loading (or downloading) anything."""
    alias = find_alias(spec)
    if alias is not None:
        if alias.hub_id is None:
            return ModelSource("embedded", alias.name, alias.name)
        return ModelSource("hub", alias.hub_id, alias.name)
    path = expanded(spec, "model")
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise SpecchatError(f"GGUF file not found: {spec}")
        return ModelSource("gguf", str(path.resolve()), path.stem)
    if path.is_dir():  # checked before hub ids: a local "owner/name" directory wins
        if not (path / "config.json").is_file():
            raise SpecchatError(f"directory {spec} has no config.json, so it is not a model directory")
        return ModelSource("dir", str(path.resolve()), path.resolve().name)
    if _HUB_ID.fullmatch(spec):
        return ModelSource("hub", spec, spec)
    raise SpecchatError(
        f"unknown model '{spec}': use an alias (see `specchat models`), a hub id, a local directory or a .gguf file"
    )


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")  # torch.save checkpoints: unpickling can run code


def check_models(specs: Iterable[str], allow_pickle: bool) -> None:
    """Each spec resolved, offline found in the local cache (hub models) and, unless
    `allow_pickle`, not pickled weights alone; one line for the first that cannot load."""
    for spec in specs:
        source = resolve(spec)
        if source.kind == "hub":
            check_cached_offline(source.location)
        if not allow_pickle:
            check_not_pickled(spec, source)


def check_not_pickled(spec: str, source: ModelSource) -> None:
    """Refuse a local model directory (`spec`, resolved to `source`) whose weights exist only as
    pickles; one line saying why."""
    if source.kind != "dir":  # hub downloads fetch safetensors only; GGUF and embedded models are not pickles
        return
    directory = Path(source.location)
    if any(directory.glob("*.safetensors")):
        return  # transformers prefers them to any pickle beside them
    pickled = sorted(path.name for path in directory.iterdir() if path.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise SpecchatError(f"{spec} holds pickled weights ({pickled[0]}), which can run code as they load: "
                            "convert them to safetensors, or pass --allow-pickle if you trust their source")


def check_cached_offline(repo_id: str) -> None:
    """Offline (HF_HUB_OFFLINE), one line at once for a hub model whose config.json the local cache
    lacks: it cannot load, and the user hears so before anything heavy is imported."""
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise SpecchatError(offline_message(repo_id))


def offline_message(repo_id: str) -> str:
    return (
        f"{repo_id} is not in the local Hugging Face cache and the Hub cannot be reached (offline): "
        f"download it once while online, or use the embedded models {DEFAULT_TARGET} / {DEFAULT_DRAFT}, "
        "which work offline"
    )
