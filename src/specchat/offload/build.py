"""Building an offloaded model as the memory plan (specchat.plan) placed it: the model assembled
from its checkpoint (specchat.checkpoint), its resident parts on the device, the other layers
streamed from a `LayerStore` through the ring. Nothing here plans."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, PreTrainedModel

from specchat.checkpoint.layer_file import fingerprint, layer_file
from specchat.checkpoint.layout import LayerLayout, layout_of
from specchat.checkpoint.skeleton import build_skeleton, decoder_layers, fill, fill_resident, layer_tensors
from specchat.checkpoint.sources import SafetensorsSource, keep_packed, pack_cache
from specchat.offload.cuda import CudaMover, CudaStallMeter
from specchat.offload.direct_io import aligned_empty
from specchat.offload.expert_cache import ExpertCache, counts_path, read_counts, write_counts
from specchat.offload.experts import WHOLE_SHARE, SlotExperts
from specchat.offload.placement import Placement
from specchat.offload.stall import StallMeter
from specchat.offload.storage import DiskStore, LayerStore, RamStore, TieredStore
from specchat.offload.streamed_layer import StreamedLayer
from specchat.offload.streamer import Streamer
from specchat.offload.transport import HostMover, ThreadTransport
from specchat.progress import Reporter
from specchat.transfer import TransferStats


@dataclass
class Offload:
    """The running parts of an offloaded model, for statistics and shutdown."""

    streamer: Streamer | None  # None when every layer is resident
    transport: ThreadTransport | None
    store: LayerStore | None
    streamed: tuple[int, ...]  # indices of the streamed decoder layers (the others are resident)
    placement: Placement | None = None
    cache: ExpertCache | None = None  # the most-routed experts on the device, where the plan made room
    counts_file: Path | None = None  # where the cache's routing counts are kept between runs

    @property
    def whole_pass_bytes(self) -> int:
        """Bytes the ring moves a pass of whole layers (a MoE's, after calls that routed widely)."""
        return sum(self.store.nbytes(layer) for layer in self.streamed)

    @property
    def loading_whole(self) -> bool:
        """Whether the ring's next loads move whole layers: the last call routed to nearly all its experts."""
        return self.streamer is not None and self.streamer.whole

    @property
    def pass_bytes(self) -> int:
        """Bytes the ring moves a pass: the streamed layers, or of a layer streamed by expert its
        head (the experts its tokens route to are fetched on top)."""
        return sum(self.transport.heads.get(layer, self.store.nbytes(layer)) for layer in self.streamed)

    @property
    def staged_share(self) -> float:
        """The share of a pass the ring holds: what can be staged while the tree grows."""
        return min(1.0, self.streamer.slots / len(self.streamed)) if self.streamer is not None else 1.0

    def stats(self) -> TransferStats:
        return self.streamer.stats() if self.streamer is not None else TransferStats()

    def close(self) -> None:
        """Stop the loader (a read in progress ends first) and close the layer file; safe after
        a failed read and when called twice; the routing counts are kept for the next run."""
        if self.transport is not None:
            self.transport.close()
        if self.store is not None:
            self.store.close()
        if self.cache is not None and self.counts_file is not None:
            write_counts(self.counts_file, self.cache.counts)


def offload_model(directory: Path, name: str, dtype: torch.dtype, device: torch.device,
                  placement: Placement | None, offload_dir: Path | None, reporter: Reporter,
                  compact_head: bool = False, compact_layers: bool = False,
                  by_expert: bool = True, whole_loads: bool = True,
                  on_host: Callable[[PreTrainedModel], frozenset[str]] | None = None
                  ) -> tuple[PreTrainedModel, Offload]:
    """Load the model in `directory` (safetensors) with its decoder layers where `placement` (made
    by the plan before anything loads) puts them, the disk tier's layer file in `offload_dir`; no
    placement keeps every layer on the device (how GPTQ checkpoints load without offloading).
    `compact_head`, `compact_layers`: the LM head, the layers' Q6_K linears and Q4_K scales as the
    GGUF stores them (quant/q6k_linear.py, q4k_scales.py), as the plan chose; such layers have a
    layer file of their own. `by_expert`: a streamed MoE layer moves its head with the ring and
    only the experts its tokens route to (offload/experts.py); False moves it whole. `whole_loads`:
    a call that routed to experts.WHOLE_SHARE of its experts has the ring load whole layers (where
    `allows_whole_loads`). `on_host`: the parameters outside the layers (named for the skeleton) left
    as the checkpoint's memory-mapped tensors, never on the device, for a preparation to replace."""
    source = SafetensorsSource(directory, pack_cache(directory, device))
    model = build_skeleton(AutoConfig.from_pretrained(directory), source, dtype, kernel=device,
                           compact_head=compact_head, compact_layers=compact_layers)
    name = f"{name}-q6" if compact_layers else name
    layers_name, layers = decoder_layers(model)
    layouts = [layout_of(layer) for layer in layers]
    fill_resident(model, layers_name, source, dtype, device, on_host(model) if on_host else frozenset())
    resident = tuple(range(len(layers))) if placement is None else placement.resident_layers
    for done, index in enumerate(resident, 1):
        reporter.step(f"loading resident layer {done}/{len(resident)}", done / len(resident))
        fill(layers[index], layer_tensors(layers[index], f"{layers_name}.{index}.", source, dtype), device)
    keep_packed(source)
    if placement is None or not placement.streamed:
        return model, Offload(None, None, None, (), placement)
    disk_store = DiskStore(layouts, layer_file(offload_dir, name, dtype), fingerprint(source, dtype, device)) \
        if placement.disk else None
    store = build_store(placement, layouts, device, disk_store)
    for part in store.parts():
        if part.needs_writing():
            write_layers(part, layers, layers_name, source, dtype, reporter)
    store.open()
    heads = {i: layouts[i].head for i in placement.streamed if layouts[i].units} if by_expert else {}
    counts_file = counts_path(layer_file(offload_dir, name, dtype)) if offload_dir is not None else None
    try:
        slots, staging, mover = make_slots(placement, device)
        cache = warm_cache(placement, layouts, device, store, staging[0] if placement.disk else slots[0],
                           counts_file) if heads and placement.expert_cache else None
        transport = ThreadTransport(store, staging, mover, heads=heads)
    except BaseException:
        store.close()
        raise
    streamer = Streamer(placement.streamed, placement.slots, transport, meter=stall_meter(device),
                        fetch_meter=stall_meter(device), start_meter=stall_meter(device))
    experts = sum(len(layouts[index].units) for index in heads)
    held = SlotExperts(whole_loads and allows_whole_loads(streamer, cache, experts)) if heads else None
    for index in placement.streamed:
        layers[index] = StreamedLayer(layers[index], index, layouts[index], streamer, slots, held, cache)
    return model, Offload(streamer, transport, store, placement.streamed, placement, cache, counts_file)


def allows_whole_loads(streamer: Streamer, cache: ExpertCache | None, experts: int) -> bool:
    """Whether calls that route widely may have the ring load whole layers: not where the ring
    stages a whole pass, as each slot then keeps one layer and the experts it fetched once, which a
    whole load would move again every pass; nor where the expert cache holds more than
    1 - WHOLE_SHARE of the streamed `experts`, as a whole load would move again those it holds."""
    return not streamer.stages_a_pass and (cache is None or cache.capacity <= (1 - WHOLE_SHARE) * experts)


def warm_cache(placement: Placement, layouts: list[LayerLayout], device: torch.device, store: LayerStore,
               staging: torch.Tensor, counts_file: Path | None) -> ExpertCache:
    """The device's cache of experts, holding from the start those an earlier run routed to most
    (its counts beside the layer file), each read once from its store through `staging`."""
    unit = max(end - start for index in placement.streamed for start, end in layouts[index].units)
    cache = ExpertCache(placement.expert_cache // unit, unit, device,
                        read_counts(counts_file) if counts_file is not None else None)
    for layer, expert in cache.most_routed():
        if layer in placement.streamed and expert < len(layouts[layer].units):
            host, = store.read_ranges(layer, [layouts[layer].units[expert]], staging)
            cache.offer(layer, expert, host)
    return cache


def build_store(placement: Placement, layouts: list[LayerLayout], device: torch.device,
                disk_store: DiskStore | None) -> LayerStore:
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
