"""Building an offloaded model: its layers placed (`placement`), resident parts on the device, the
others streamed from a `LayerStore` through the ring."""

import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from specchat.memory_room import Room, ram_room
from specchat.offload.budget import DENSE_COPIES, OS_RESERVE, Ask, Draft, Item, MemoryPlan, Target, plan_memory
from specchat.offload.cuda import CudaMover, CudaStallMeter, free_bytes
from specchat.offload.demand import shape_of
from specchat.offload.direct_io import aligned_empty
from specchat.offload.layout import LayerLayout, plan_layout
from specchat.offload.placement import Placement, Request, Rooms
from specchat.offload.sizes import measure_sizes
from specchat.offload.skeleton import (build_skeleton, compact_the_layers, decoder_layers, fill, fill_resident,
                                      has_compact_layers, layer_tensors, q6_head)
from specchat.quant.q6k import q6_bytes
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.q6k_linear import workspace_bytes as q6_workspace
from specchat.offload.sources import SafetensorsSource
from specchat.offload.stall import StallMeter
from specchat.offload.storage import DiskStore, LayerStore, RamStore, TieredStore
from specchat.offload.streamed_layer import StreamedLayer
from specchat.offload.streamer import Streamer
from specchat.offload.transport import HostMover, ThreadTransport
from specchat.progress import Reporter
from specchat.quant.int4 import Int4Linear, workspace_bytes
from specchat.quant.int4_cache import PackCache, cache_path
from specchat.quant.int4_checkpoint import INT4_FILE
from specchat.quant.int4_dense import dense_copy_bytes
from specchat.quant.int4_pack import layout_key
from specchat.transfer import TransferStats, gb

Tier = Literal["auto", "none", "ram", "disk"]
DEFAULT_TREE_TOKENS = 1024  # the largest tree a CPU's --budget auto builds (limits.auto_cap)


@dataclass(frozen=True)
class OffloadPlan:
    """What the user asked for; `plan_model` turns it into a `MemoryPlan` on this machine."""

    tier: Tier  # none: every layer on the device
    offload_dir: Path  # where the disk tier's layer file lives
    resident_layers: int | None = None  # None: as many as fit
    slots: int | None = None  # ring size; None: what the room left holds, up to a whole pass
    ram_budget: int | None = None  # bytes of RAM specchat may take; None: what the process may take
    vram_budget: int | None = None  # bytes of GPU memory specchat may take; None: what is free
    tree_tokens: int = DEFAULT_TREE_TOKENS  # the largest tree a pass scores (activation headroom)
    smaller_trees: tuple[int, ...] = ()  # smaller largest trees auto may fall back to, in order
    contexts: tuple[int, ...] = ()  # the KV room's length, in order of preference; (): the model's own
    drafts: tuple[Draft | None, ...] = (None,)  # the draft's candidate quantizations, preferred first
    # a CPU's 4-bit linears may keep dense copies for wide inputs where room is left (quant/int4_dense.py)
    dense_copies: bool = False


@dataclass
class Offload:
    """The running parts of an offloaded model, for statistics and shutdown."""

    streamer: Streamer | None  # None when every layer is resident
    transport: ThreadTransport | None
    store: LayerStore | None
    streamed: list[int]  # indices of the streamed decoder layers (the others are resident)
    placement: Placement | None = None

    @property
    def pass_bytes(self) -> int:
        """Bytes one full pass streams."""
        return sum(self.store.nbytes(layer) for layer in self.streamed)

    @property
    def staged_share(self) -> float:
        """The share of a pass the ring holds: what can be staged while the tree grows."""
        return min(1.0, self.streamer.slots / len(self.streamed)) if self.streamer is not None else 1.0

    def stats(self) -> TransferStats:
        return self.streamer.stats() if self.streamer is not None else TransferStats()

    def close(self) -> None:
        """Stop the loader (a read in progress ends first) and close the layer file; safe after
        a failed read and when called twice."""
        if self.transport is not None:
            self.transport.close()
        if self.store is not None:
            self.store.close()


def offload_model(directory: Path, name: str, dtype: torch.dtype, device: torch.device, plan: OffloadPlan | None,
                  reporter: Reporter, placement: Placement | None = None,
                  compact_head: bool = False, compact_layers: bool = False) -> tuple[PreTrainedModel, Offload]:
    """Load the model in `directory` (safetensors) with its decoder layers placed per `plan`
    (or per `placement`, already made for it); no plan keeps every layer on the device (how GPTQ
    checkpoints load without offloading). The placement is made before anything is loaded or
    written. `compact_head`, `compact_layers`: the LM head, the layers' Q6_K linears and Q4_K
    scales as the GGUF stores them (quant/q6k_linear.py, q4k_scales.py), as the plan chose; such
    layers have a layer file of their own."""
    source = SafetensorsSource(directory, pack_cache(directory, device))
    model = build_skeleton(AutoConfig.from_pretrained(directory), source, dtype, kernel=device,
                           compact_head=compact_head, compact_layers=compact_layers)
    name = f"{name}-q6" if compact_layers else name
    layers_name, layers = decoder_layers(model)
    layouts = [layout_of(layer) for layer in layers]
    disk_store = None if plan is None else \
        DiskStore(layouts, layer_file(plan, name, dtype), fingerprint(source, dtype, device))
    if plan is not None and placement is None:
        placement = plan_layers(model, layers_name, layouts, dtype, device, plan, disk_store).placement
    fill_resident(model, layers_name, source, dtype, device)
    resident = len(layers) if placement is None else placement.resident
    for index in range(resident):
        reporter.step(f"loading resident layer {index + 1}/{resident}", (index + 1) / max(resident, 1))
        fill(layers[index], layer_tensors(layers[index], f"{layers_name}.{index}.", source, dtype), device)
    keep_packed(source)
    if placement is None or not placement.streamed:
        return model, Offload(None, None, None, [], placement)
    store = build_store(placement, layouts, device, disk_store)
    for part in store.parts():
        if part.needs_writing():
            write_layers(part, layers, layers_name, source, dtype, reporter)
    store.open()
    try:
        slots, staging, mover = make_slots(placement, device)
        transport = ThreadTransport(store, staging, mover)
    except BaseException:
        store.close()
        raise
    streamer = Streamer(placement.streamed, placement.slots, transport, meter=stall_meter(device))
    for index in placement.streamed:
        layers[index] = StreamedLayer(layers[index], index, layouts[index], streamer, slots)
    return model, Offload(streamer, transport, store, placement.streamed, placement)


def pack_cache(directory: Path, device: torch.device) -> PackCache | None:
    """Where a checkpoint of Int4Weights (an embedded model's 4-bit conversion) keeps them packed
    for this device's kernel; None for other checkpoints (GPTQ's are packed as a layer file
    is written, or at load)."""
    return PackCache(cache_path(directory, device.type)) if (directory / INT4_FILE).is_file() else None


def keep_packed(source: SafetensorsSource) -> None:
    if source.pack_cache is not None:
        source.pack_cache.save()


def plan_model(config: PretrainedConfig, source: SafetensorsSource | None, name: str, dtype: torch.dtype,
               device: torch.device, plan: OffloadPlan, rooms: Rooms | None = None) -> MemoryPlan:
    """The whole memory plan of `plan` for the model of `config` on this machine (or in `rooms`,
    a described one), without loading anything (`source` None: sized from the config alone)."""
    model = build_skeleton(config, source, dtype, kernel=device)
    layers_name, layers = decoder_layers(model)
    layouts = [layout_of(layer) for layer in layers]
    reuse = None if source is None else \
        DiskStore(layouts, layer_file(plan, name, dtype), fingerprint(source, dtype, device))
    compact = source is not None and q6_head(model, source) is not None
    compact_layouts = None
    if source is not None and has_compact_layers(model, source):
        compact_the_layers(model, source, dtype)  # the skeleton serves the plan only: its dense layouts are taken
        compact_layouts = [layout_of(layer) for layer in layers]
    return plan_layers(model, layers_name, layouts, dtype, device, plan, reuse, rooms, compact, compact_layouts)


def plan_layers(model: PreTrainedModel, layers_name: str, layouts: list[LayerLayout], dtype: torch.dtype,
                device: torch.device, plan: OffloadPlan, disk_store: DiskStore | None,
                rooms: Rooms | None = None, compact_head: bool = False,
                compact_layouts: list[LayerLayout] | None = None) -> MemoryPlan:
    """`compact_head`: the checkpoint also holds the LM head in Q6_K, which the plan may choose;
    `compact_layouts`: the layers' layouts with their Q6_K linears and Q4_K scales as stored, which
    it may choose too (`model`'s layers are then in that form; `layouts` are the dense ones)."""
    sizes = measure_sizes(model, layers_name, layouts, dtype)
    compact_layers = None if compact_layouts is None else measure_sizes(model, layers_name, compact_layouts, dtype)
    reusable = disk_store is not None and disk_store.reusable
    rooms = rooms or measure_rooms(plan, device, sizes.file_bytes if reusable else 0)
    contexts = plan.contexts or (model.config.max_position_embeddings,)
    resident = len(layouts) if plan.tier == "none" else plan.resident_layers
    tier = "auto" if plan.tier == "none" else plan.tier
    ask = Ask(contexts, plan.drafts, plan.tree_tokens, quantized_workspace(model, plan.tree_tokens, dtype),
              Request(tier, resident, plan.slots), cuda=device.type == "cuda",
              smaller_trees=tuple((tree, quantized_workspace(model, tree, dtype)) for tree in plan.smaller_trees))
    compact = compact_fixed(model, sizes.fixed, dtype) if compact_head else None
    memory = plan_memory(Target(sizes, shape_of(model.config, dtype), compact, compact_layers), ask, rooms)
    return with_dense_copies(memory, dense_copy_bytes(model) if plan.dense_copies and device.type == "cpu" else 0)


def with_dense_copies(plan: MemoryPlan, nbytes: int) -> MemoryPlan:
    """`plan` with the 4-bit linears' dense copies for wide inputs (quant/int4_dense.py) where every
    layer is on the device and the room left holds them all: they never displace anything else."""
    if not nbytes or plan.placement.streamed or plan.total("device") + nbytes > plan.rooms.device:
        return plan
    item = Item("device", DENSE_COPIES, nbytes)
    return replace(plan, items=(*plan.items, item),
                   notes=(*plan.notes, "4-bit linears keep dense copies for tree passes: the room holds them"))


def compact_fixed(model: PreTrainedModel, fixed: int, dtype: torch.dtype) -> int:
    """The fixed parts' bytes with the dense LM head replaced by its Q6Weight and a call's chunk buffers."""
    vocab, width = model.get_output_embeddings().weight.shape
    return fixed - vocab * width * dtype.itemsize + q6_bytes(vocab, width) + q6_workspace(width, vocab, dtype)


def quantized_workspace(model: PreTrainedModel, rows: int, dtype: torch.dtype) -> int:
    """The largest temporary a 4-bit linear (quant.int4's bound, over `rows` input rows) or a
    layer's Q6_K one (its chunk buffers) allocates; linears run one at a time, so the largest one's.
    A model whose layers are compact bounds its dense form too: the same 4-bit linears, and dense
    linears allocate nothing."""
    int4 = (workspace_bytes(m.in_features, m.out_features, rows, dtype, m.group_size, m.kernel)
            for m in model.modules() if isinstance(m, Int4Linear))
    q6 = (m.workspace(dtype) for m in model.get_decoder().modules() if isinstance(m, Q6Linear))
    return max((*int4, *q6), default=0)


def measure_rooms(plan: OffloadPlan, device: torch.device, reusable_file: int) -> Rooms:
    """What each tier offers now: the RAM this process may take (cgroup limits included), or the
    budget when it is smaller, less what the OS keeps on a CPU when the host's RAM bounds it (a
    container's OS lives outside its limit; beside a GPU the plan counts it); the GPU's free memory
    or its budget; the free disk, where a reusable layer file counts as free. What the process
    already holds (python, torch, transformers, the tokenizer) is outside the room: available RAM
    and a cgroup's usage both count it."""
    cpu = device.type != "cuda"
    ram = ram_room()
    if cpu and not ram.limit:
        ram = Room(ram.bytes - OS_RESERVE, f"RAM ({ram.bound}, less {gb(OS_RESERVE)} for the OS)")
    if plan.ram_budget is not None and plan.ram_budget < ram.bytes:
        ram = Room(plan.ram_budget, f"RAM under --ram-budget {plan.ram_budget / 1e9:g} GB")
    disk_dir = next(path for path in (plan.offload_dir, *plan.offload_dir.parents) if path.exists())
    disk = shutil.disk_usage(disk_dir).free + reusable_file
    disk_name = str(plan.offload_dir)
    if cpu:
        return Rooms(ram.bytes, None, disk, ram.bound, ram.bound, disk_name)
    vram, vram_name = capped(free_bytes(device), plan.vram_budget, "GPU memory", "--vram-budget")
    return Rooms(vram, ram.bytes, disk, vram_name, f"RAM ({ram.bound})", disk_name)


def capped(free: int, budget: int | None, what: str, option: str) -> tuple[int, str]:
    """min(free, budget), named as an error should name it."""
    if budget is not None and budget <= free:
        return budget, f"{what} under {option} {budget / 1e9:g} GB"
    return free, f"{what} ({gb(free)} free)"


def layer_file(plan: OffloadPlan, name: str, dtype: torch.dtype) -> Path:
    stem = re.sub(r"[^\w.-]+", "_", name) + "-" + str(dtype).removeprefix("torch.")
    return plan.offload_dir / f"{stem}.layers"


def fingerprint(source: SafetensorsSource, dtype: torch.dtype, device: torch.device) -> dict:
    """What the layer file's bytes depend on: the checkpoint, the dtype, and the layout the
    device's int4 kernel packs its 4-bit weights in."""
    return {**source.fingerprint(), "dtype": str(dtype), "int4 layout": layout_key(device.type)}


def layout_of(layer) -> LayerLayout:
    return plan_layout([(name, t.dtype, tuple(t.shape)) for name, t in layer.state_dict().items()])


def build_store(placement: Placement, layouts: list[LayerLayout], device: torch.device,
                disk_store: DiskStore) -> LayerStore:
    ram = RamStore({layer: layouts[layer] for layer in placement.ram_layers}, pin=device.type == "cuda")
    if not placement.disk:
        return ram
    return TieredStore(ram, disk_store) if placement.ram else disk_store


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


def make_slots(placement: Placement, device: torch.device):
    """The ring's slots on the compute device, where disk reads land, and the mover between."""
    size, count = placement.slot_bytes, placement.slots
    if device.type == "cuda":
        slots = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(count)]
        staging = [aligned_empty(size, pin=True) for _ in range(count)] if placement.disk else [None] * count
        return slots, staging, CudaMover(slots)
    slots = [aligned_empty(size) for _ in range(count)]
    return slots, slots, HostMover(slots)


def stall_meter(device: torch.device) -> StallMeter | None:
    """How compute's waits for layers are timed: on the compute stream on CUDA, by the host clock
    (the streamer's default) on CPU."""
    return CudaStallMeter(device) if device.type == "cuda" else None
