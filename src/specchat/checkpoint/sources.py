"""Reading a checkpoint's tensors one at a time, so a model never has to fit in memory whole."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from specchat.checkpoint.names import model_names, model_type
from specchat.errors import SpecchatError
from specchat.quant.int4_cache import PackCache, cache_path, is_cache_file
from specchat.quant.int4_checkpoint import INT4_FILE


class SafetensorsSource:
    """The tensors of a model directory's *.safetensors files (sharded or not), by the names the
    model gives them (checkpoint/names.py: a Mixtral's experts, say)."""

    def __init__(self, directory: Path, pack_cache: PackCache | None = None) -> None:
        self.directory = directory
        self.pack_cache = pack_cache  # its Int4Weights packed for the kernel at hand, when kept
        # a pack cache beside the checkpoint is written after the first load: counted among the
        # files, it would change the fingerprint, and the next run would rewrite the layer file
        self.files = sorted(path for path in directory.glob("*.safetensors") if not is_cache_file(path))
        if not self.files:
            raise SpecchatError(f"{directory} has no .safetensors files: offloading reads safetensors checkpoints")
        self.handles = {path: safe_open(str(path), framework="pt") for path in self.files}
        stored = {name: path for path, handle in self.handles.items() for name in handle.keys()}
        self.stored = model_names(model_type(directory), stored)  # the model's name -> the checkpoint's
        self.where = {name: stored[checkpoint] for name, checkpoint in self.stored.items()}

    def names(self) -> list[str]:
        return list(self.where)

    def get(self, name: str) -> torch.Tensor:
        return self.handle(name).get_tensor(self.stored[name])

    def shape(self, name: str) -> list[int]:
        """A tensor's shape, read from the file's header alone."""
        return list(self.handle(name).get_slice(self.stored[name]).get_shape())

    def handle(self, name: str) -> safe_open:
        """The open file that holds tensor `name`."""
        if name not in self.where:
            raise SpecchatError(f"the checkpoint in {self.directory} has no tensor '{name}'")
        return self.handles[self.where[name]]

    def fingerprint(self) -> dict:
        """Identifies the files' contents cheaply (path, size, modification time)."""
        return {
            "files": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in self.files],
            "config": json.loads((self.directory / "config.json").read_text()),
        }


def pack_cache(directory: Path, device: torch.device) -> PackCache | None:
    """Where a checkpoint of Int4Weights (an embedded model's 4-bit conversion) keeps them packed
    for this device's kernel; None for other checkpoints (GPTQ's are packed as a layer file
    is written, or at load)."""
    return PackCache(cache_path(directory, device.type)) if (directory / INT4_FILE).is_file() else None


def keep_packed(source: SafetensorsSource) -> None:
    if source.pack_cache is not None:
        source.pack_cache.save()
