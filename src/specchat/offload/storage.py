"""Where streamed layers live between passes: the `ram` tier (one buffer per layer; beside CUDA
views of a few pinned buffers holding them end to end, offload/pinned_chunks.py), the `disk` tier
(one file of per-layer blobs read with O_DIRECT, so reads come from the drive and not from the
page cache, as with a model larger than RAM), and both at once (the first streamed layers in RAM,
the others on disk)."""

import json
import os
from pathlib import Path
from typing import Protocol

import torch

from specchat.checkpoint.layout import LayerLayout, pack_into
from specchat.diskspace import check_free_space, disk_full_is_one_line
from specchat.offload.direct_io import DirectReader, align_up, aligned_empty, evict, write_blob
from specchat.offload.pinned_chunks import pinned_blobs


class LayerStore(Protocol):
    """Layers by their index in the model's layer list. Filled once (`needs_writing`, then
    `begin_writing`, `write` of every layer of `stored_layers`, `finish_writing`, or
    `abort_writing` on any error), then `open` for reads until `close`."""

    writing_label: str  # what filling it does, as a progress bar names it

    def stored_layers(self) -> list[int]:
        """Indices of the layers it holds."""

    def needs_writing(self) -> bool:
        """False when it already holds the layers (a layer file written by an earlier run)."""

    def begin_writing(self) -> None: ...

    def write(self, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        """Store one layer's tensors (cast to the layout's dtypes)."""

    def finish_writing(self) -> None: ...

    def abort_writing(self) -> None:
        """Drop what was written so far: nothing partial stays behind."""

    def open(self) -> None:
        """Get ready to read."""

    def read(self, layer: int, staging: torch.Tensor) -> torch.Tensor:
        """Host bytes of `layer`: the store's own buffer, or `staging` filled from disk."""

    def follows(self, previous: int, layer: int) -> bool:
        """True when reading `layer` in the same request, right after `previous`, is one
        contiguous read (worth coalescing)."""

    def read_run(self, layers: list[int], stagings: list[torch.Tensor]) -> list[torch.Tensor]:
        """`read` of several layers, each following the one before, in one request."""

    def read_ranges(self, layer: int, ranges: list[tuple[int, int]], staging: torch.Tensor) -> list[torch.Tensor]:
        """Host bytes of `layer`'s byte ranges (start, end), each at its own place in `staging`
        when read from disk: a range starts on a direct-I/O boundary (its layout's head or an
        expert's unit), and what is read past its end stays inside the next boundary."""

    def nbytes(self, layer: int) -> int: ...

    def parts(self) -> list["LayerStore"]:
        """The stores that are filled one by one (itself, or a tiered store's two)."""

    def close(self) -> None: ...


class RamStore:
    """The streamed layers only, each in its buffer, packed at every start (RAM does not persist)."""

    writing_label = "packing layers in RAM"

    def __init__(self, layouts: dict[int, LayerLayout], pin: bool) -> None:
        self.layouts = layouts  # the streamed layers only
        self.blobs = pinned_blobs(layouts) if pin else \
            {layer: aligned_empty(layout.nbytes) for layer, layout in layouts.items()}

    def stored_layers(self) -> list[int]:
        return list(self.layouts)

    def needs_writing(self) -> bool:
        return True

    def begin_writing(self) -> None:
        pass  # the buffers exist from the start

    def write(self, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        pack_into(self.layouts[layer], tensors, self.blobs[layer])

    def finish_writing(self) -> None:
        pass  # nothing to flush

    def abort_writing(self) -> None:
        pass  # the buffers are rewritten at every start

    def open(self) -> None:
        pass  # reads return the buffers themselves

    def read(self, layer: int, staging: torch.Tensor) -> torch.Tensor:
        return self.blobs[layer]

    def follows(self, previous: int, layer: int) -> bool:
        return False  # nothing to gain: a read is the buffer itself

    def read_run(self, layers: list[int], stagings: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.blobs[layer] for layer in layers]

    def read_ranges(self, layer: int, ranges: list[tuple[int, int]], staging: torch.Tensor) -> list[torch.Tensor]:
        return [self.blobs[layer][start:end] for start, end in ranges]

    def nbytes(self, layer: int) -> int:
        return self.layouts[layer].nbytes

    def parts(self) -> list[LayerStore]:
        return [self]

    def close(self) -> None:
        pass  # the buffers go with the store


def blob_offsets(layouts: list[LayerLayout]) -> list[int]:
    """Each blob starts on an O_DIRECT boundary, right after the previous one."""
    offsets, end = [], 0
    for layout in layouts:
        offsets.append(end)
        end += align_up(layout.nbytes)
    return offsets


class DiskStore:
    """Every layer of a model in one file, whatever is streamed (so changing --resident-layers
    does not rewrite it); `fingerprint` names what was written, so a later run with the same
    model, dtype and layout reuses the file instead of writing it again."""

    writing_label = "writing the layer file"

    def __init__(self, layouts: list[LayerLayout], path: Path, fingerprint: dict) -> None:
        self.layouts = layouts
        self.path = path
        self.offsets = blob_offsets(layouts)
        self.manifest_path = path.with_suffix(".json")
        self.fingerprint = {**fingerprint, "layers": [layout_record(layout) for layout in layouts]}
        self.reader: DirectReader | None = None
        self.fd: int | None = None

    @property
    def reusable(self) -> bool:
        """True when the file on disk holds exactly these layers (its manifest is written last)."""
        if not (self.path.is_file() and self.manifest_path.is_file()):
            return False
        if self.path.stat().st_size != self.file_bytes:
            return False  # truncated (or grown) since it was written: written again
        try:
            return json.loads(self.manifest_path.read_text()) == self.fingerprint
        except json.JSONDecodeError:
            return False  # a damaged manifest: the file is written again

    def stored_layers(self) -> list[int]:
        return list(range(len(self.layouts)))

    def needs_writing(self) -> bool:
        return not self.reusable

    @property
    def partial_path(self) -> Path:
        """Where the file is written, renamed to `path` only once complete."""
        return self.path.with_name(self.path.name + ".partial")

    @property
    def file_bytes(self) -> int:
        return self.offsets[-1] + align_up(self.layouts[-1].nbytes)

    def begin_writing(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.manifest_path.unlink(missing_ok=True)  # the old file is no longer what it says
        self.path.unlink(missing_ok=True)  # and its space is needed for the new one
        self.partial_path.unlink(missing_ok=True)  # left by a run that was killed
        check_free_space(self.path.parent, self.file_bytes, "the layer file")
        self.fd = os.open(self.partial_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.scratch = aligned_empty(max(layout.nbytes for layout in self.layouts))

    def write(self, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        layout = self.layouts[layer]
        pack_into(layout, tensors, self.scratch)
        with disk_full_is_one_line(self.path.parent, self.file_bytes, "the layer file"):
            write_blob(self.fd, self.scratch[: layout.nbytes], self.offsets[layer])

    def abort_writing(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.partial_path.unlink(missing_ok=True)

    def finish_writing(self) -> None:
        """Make the file durable, give it its name, record what it holds, and drop it from the
        page cache."""
        with disk_full_is_one_line(self.path.parent, self.file_bytes, "the layer file"):
            os.fsync(self.fd)
        os.close(self.fd)
        self.fd = None
        del self.scratch
        os.replace(self.partial_path, self.path)
        temp = self.manifest_path.with_suffix(".json.tmp")
        temp.write_text(json.dumps(self.fingerprint))
        os.replace(temp, self.manifest_path)
        evict(self.path)

    def open(self) -> None:
        evict(self.path)  # a file just written or read by an earlier run may sit in the page cache
        self.reader = DirectReader(self.path)

    def read(self, layer: int, staging: torch.Tensor) -> torch.Tensor:
        return self.read_run([layer], [staging])[0]

    def follows(self, previous: int, layer: int) -> bool:
        return layer == previous + 1  # blobs lie in layer order, back to back

    def read_run(self, layers: list[int], stagings: list[torch.Tensor]) -> list[torch.Tensor]:
        views = [staging[:align_up(self.layouts[layer].nbytes)] for layer, staging in zip(layers, stagings)]
        self.reader.read_many(views, self.offsets[layers[0]])
        return views

    def read_ranges(self, layer: int, ranges: list[tuple[int, int]], staging: torch.Tensor) -> list[torch.Tensor]:
        for start, end in spans(ranges):
            self.reader.read_into(staging[start:align_up(end)], self.offsets[layer] + start)
        return [staging[start:end] for start, end in ranges]

    def nbytes(self, layer: int) -> int:
        return self.layouts[layer].nbytes

    def parts(self) -> list[LayerStore]:
        return [self]

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


def spans(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges (ascending) joined where one starts on the boundary right after the one before: read
    as one, the padding between them included."""
    joined: list[tuple[int, int]] = []
    for start, end in ranges:
        if joined and start == align_up(joined[-1][1]):
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return joined


def layout_record(layout: LayerLayout) -> list:
    return [[p.name, str(p.dtype), list(p.shape), p.offset] for p in layout.places]


class TieredStore:
    """Streamed layers split between RAM (the first ones) and the disk file (the rest); filled
    through its `parts`."""

    def __init__(self, ram: RamStore, disk: DiskStore) -> None:
        self.ram = ram
        self.disk = disk

    def of(self, layer: int) -> LayerStore:
        return self.ram if layer in self.ram.layouts else self.disk

    def read(self, layer: int, staging: torch.Tensor) -> torch.Tensor:
        return self.of(layer).read(layer, staging)

    def follows(self, previous: int, layer: int) -> bool:
        return self.of(previous) is self.of(layer) and self.of(layer).follows(previous, layer)

    def read_run(self, layers: list[int], stagings: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.of(layers[0]).read_run(layers, stagings)

    def read_ranges(self, layer: int, ranges: list[tuple[int, int]], staging: torch.Tensor) -> list[torch.Tensor]:
        return self.of(layer).read_ranges(layer, ranges, staging)

    def nbytes(self, layer: int) -> int:
        return self.of(layer).nbytes(layer)

    def parts(self) -> list[LayerStore]:
        return [self.ram, self.disk]

    def open(self) -> None:
        for part in self.parts():
            part.open()

    def close(self) -> None:
        for part in self.parts():
            part.close()
