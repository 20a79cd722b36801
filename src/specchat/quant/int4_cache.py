"""Packed int4 layouts kept beside a checkpoint, so that a model is packed once per machine.

Packing (int4_pack.pack) runs torch's converter over every weight: ~20 s for the default target's
1.1 G weights on the 2-core dev machine, at every start if nothing kept it. The layout depends on
the kernel (the CPU's vector width, torch's version: int4_pack.layout_key), so the packed tensors
are stored in a file named after that key, in the checkpoint's directory, written after the first
load that packs them; a machine with another key packs its own.
"""

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from specchat.quant.int4_pack import layout_key


class PackCache:
    """The packed layout of each Int4Weight of a checkpoint, by module name, for one kernel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stored = safe_open(str(path), framework="pt") if path.is_file() else None
        self.names = set(self.stored.keys()) if self.stored is not None else set()
        self.made: dict[str, Tensor] = {}
        self.collecting = True  # until `save`: what is packed later goes to a layer file instead

    def holds(self, module: str) -> bool:
        """Whether `module`'s packed weight is kept (stored, or packed since the file was read)."""
        return module in self.names or module in self.made

    def packed(self, module: str, pack: Callable[[], Tensor]) -> Tensor:
        """`module`'s packed weight as stored, else `pack()`'s (kept for `save` until it runs)."""
        if module in self.names:
            return self.stored.get_tensor(module)
        if module in self.made:
            return self.made[module]
        packed = pack().contiguous()
        if self.collecting:
            self.made[module] = packed
        return packed

    def save(self) -> None:
        """Store what was packed since the file was read (with what it held), atomically, and stop
        collecting: the model's resident part is loaded, and streamed layers are kept packed in
        their layer file, not in memory until the end."""
        self.collecting = False
        if not self.made:
            return
        tensors = {name: self.stored.get_tensor(name) for name in self.names} | self.made
        fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.close(fd)
        temp = Path(name)
        try:
            save_file(tensors, str(temp))
            os.replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self.made.clear()


CACHE_PREFIX = "int4-packed-"


def cache_path(directory: Path, device_type: str) -> Path:
    """Where the packed layouts of `directory`'s checkpoint for `device_type`'s kernel live."""
    digest = hashlib.sha256(layout_key(device_type).encode()).hexdigest()[:16]
    return directory / f"{CACHE_PREFIX}{device_type}-{digest}.safetensors"


def is_cache_file(path: Path) -> bool:
    """Whether `path` is a pack cache (any kernel's) rather than one of the checkpoint's files."""
    return path.name.startswith(CACHE_PREFIX)
