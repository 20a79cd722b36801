"""Building an offloaded model: resident parts on the device, other layers streamed from a `LayerStore`."""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil
import torch
from transformers import AutoConfig, PreTrainedModel

from specchat.errors import SpecchatError
from specchat.offload.cuda import CudaMover
from specchat.offload.direct_io import align_up, aligned_empty
from specchat.offload.layout import LayerLayout, plan_layout
from specchat.offload.skeleton import build_skeleton, decoder_layers, fill, fill_resident, layer_tensors
from specchat.offload.sources import SafetensorsSource
from specchat.offload.storage import DiskStore, LayerStore, RamStore
from specchat.offload.streamed_layer import StreamedLayer
from specchat.offload.streamer import Streamer
from specchat.offload.transport import HostMover, ThreadTransport
from specchat.progress import Reporter
from specchat.transfer import TransferStats

Tier = Literal["ram", "disk"]

# Room kept free on the compute device beside the resident layers: KV caches, the tree's
# activations and the LM head's logits.
_HEADROOM_BYTES = 2 * 2**30


@dataclass(frozen=True)
class OffloadPlan:
    tier: Tier
    offload_dir: Path  # where the disk tier's layer file lives
    resident_layers: int | None = None  # None: as many as free memory allows
    slots: int = 4  # ring size: one layer computing, slots - 1 loading ahead


@dataclass
class Offload:
    """The running parts of an offloaded model, for statistics and shutdown."""

    streamer: Streamer | None  # None when every layer is resident
    transport: ThreadTransport | None
    store: LayerStore | None
    streamed: list[int]  # indices of the streamed decoder layers (the others are resident)

    @property
    def pass_bytes(self) -> int:
        """Bytes one full pass streams."""
        return sum(self.store.nbytes(layer) for layer in self.streamed)

    def stats(self) -> TransferStats:
        return self.streamer.stats() if self.streamer is not None else TransferStats()

    def close(self) -> None:
        if self.streamer is not None:
            self.streamer.drain()
            self.transport.close()
        if self.store is not None:
            self.store.close()


def offload_model(directory: Path, name: str, dtype: torch.dtype, device: torch.device, plan: OffloadPlan | None,
                  reporter: Reporter) -> tuple[PreTrainedModel, Offload]:
    """Load the model in `directory` (safetensors) with its decoder layers offloaded per `plan`;
    no plan keeps every layer on the device (how GPTQ checkpoints load without offloading)."""
    source = SafetensorsSource(directory)
    model = build_skeleton(AutoConfig.from_pretrained(directory), source, dtype)
    layers_name, layers = decoder_layers(model)
    fill_resident(model, layers_name, source, dtype, device)
    layouts = [layout_of(layer) for layer in layers]
    resident = len(layers) if plan is None else plan.resident_layers
    if resident is None:
        resident = default_resident_layers(layouts, device, plan.slots)
    if not 0 <= resident <= len(layers):
        raise SpecchatError(f"--resident-layers must be between 0 and {len(layers)} (got {resident})")
    for index in range(resident):
        reporter.step(f"loading resident layer {index + 1}/{resident}", (index + 1) / max(resident, 1))
        fill(layers[index], layer_tensors(layers[index], f"{layers_name}.{index}.", source, dtype), device)
    streamed = list(range(resident, len(layers)))
    if not streamed:
        return model, Offload(None, None, None, [])
    store = build_store(plan, layouts, streamed, device, dtype, name, source)
    if store.needs_writing():
        write_layers(store, layers, layers_name, source, dtype, reporter)
    store.open()
    slots, staging, mover = make_slots(plan, [layouts[i] for i in streamed], device)
    transport = ThreadTransport(store, staging, mover)
    streamer = Streamer(streamed, plan.slots, transport)
    for index in streamed:
        layers[index] = StreamedLayer(layers[index], index, layouts[index], streamer, slots)
    return model, Offload(streamer, transport, store, streamed)


def layout_of(layer) -> LayerLayout:
    return plan_layout([(name, t.dtype, tuple(t.shape)) for name, t in layer.state_dict().items()])


def default_resident_layers(layouts: list[LayerLayout], device: torch.device, slots: int) -> int:
    """As many whole layers as the device's free memory holds beside the ring and headroom."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available
    largest = max(layout.nbytes for layout in layouts)
    room = free - _HEADROOM_BYTES - slots * largest
    count = 0
    for layout in layouts:
        if room < layout.nbytes:
            break
        room -= layout.nbytes
        count += 1
    return count


def build_store(plan: OffloadPlan, layouts: list[LayerLayout], streamed: list[int], device: torch.device,
                dtype: torch.dtype, name: str, source: SafetensorsSource) -> LayerStore:
    if plan.tier == "ram":
        return RamStore({layer: layouts[layer] for layer in streamed}, pin=device.type == "cuda")
    stem = re.sub(r"[^\w.-]+", "_", name) + "-" + str(dtype).removeprefix("torch.")
    fingerprint = {**source.fingerprint(), "dtype": str(dtype)}
    return DiskStore(layouts, plan.offload_dir / f"{stem}.layers", fingerprint)


def write_layers(store: LayerStore, layers, layers_name: str, source: SafetensorsSource, dtype: torch.dtype,
                 reporter: Reporter) -> None:
    """Fill the store with the layers it holds (the disk file: every layer; RAM: the streamed ones)."""
    indices = store.stored_layers()
    store.begin_writing()
    try:
        with reporter.bar(total=len(indices), desc=store.writing_label, unit="layer") as bar:
            for index in indices:
                store.write(index, layer_tensors(layers[index], f"{layers_name}.{index}.", source, dtype))
                bar.update()
        store.finish_writing()
    except BaseException:
        store.abort_writing()
        raise


def make_slots(plan: OffloadPlan, layouts: list[LayerLayout], device: torch.device):
    """The ring's slots on the compute device, where disk reads land, and the mover between."""
    size = align_up(max(layout.nbytes for layout in layouts))
    count = min(plan.slots, len(layouts))
    if device.type == "cuda":
        slots = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(count)]
        staging = [aligned_empty(size, pin=True) for _ in range(count)] if plan.tier == "disk" else [None] * count
        return slots, staging, CudaMover(slots)
    slots = [aligned_empty(size) for _ in range(count)]
    return slots, slots, HostMover(slots)
