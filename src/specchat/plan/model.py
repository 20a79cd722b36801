"""The memory plan of one model (and the drafts the request weighs beside it) on a machine: its
skeleton built on the meta device, its layers' bytes as the layer file lays them out, its fixed
parts in each stored form, and what the machine's tiers offer; nothing loaded or written."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from specchat.checkpoint.layer_file import fingerprint, layer_file
from specchat.checkpoint.layout import LayerLayout, layout_of
from specchat.checkpoint.skeleton import build_skeleton, compact_the_layers, decoder_layers, has_compact_layers, q6_head
from specchat.checkpoint.sources import SafetensorsSource
from specchat.offload.storage import DiskStore
from specchat.plan.budget import DENSE_COPIES, EXPERT_CACHE, Ask, Item, MemoryPlan, Target, plan_memory
from specchat.plan.demand import shape_of
from specchat.plan.machine import Machine
from specchat.plan.request import PlanRequest
from specchat.plan.sizes import host_embedding_bytes, measure_sizes
from specchat.quant.int4 import Int4Linear, workspace_bytes
from specchat.quant.int4_dense import dense_copy_bytes
from specchat.quant.q6k import q6_bytes
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.q6k_linear import rows_workspace as q6_rows
from specchat.quant.q6k_linear import workspace_bytes as q6_workspace
from specchat.quant.widened import widened_rows, widened_workspace


def plan_checkpoint(directory: Path, name: str, dtype: torch.dtype, machine: Machine,
                    request: PlanRequest) -> MemoryPlan:
    """The plan of the safetensors checkpoint in `directory`, measured as it is; its layer file
    goes by `name` (and is reused when it holds these bytes)."""
    source = SafetensorsSource(directory)
    return plan_model(AutoConfig.from_pretrained(directory), source, name, dtype, machine, request)


def plan_model(config: PretrainedConfig, source: SafetensorsSource | None, name: str, dtype: torch.dtype,
               machine: Machine, request: PlanRequest) -> MemoryPlan:
    """The whole memory plan of `request` for the model of `config` on `machine`, without loading
    anything (`source` None: sized from the config alone)."""
    return plan_measured(measure_model(config, source, name, dtype, machine.device(), request), machine)


@dataclass(frozen=True)
class MeasuredModel:
    """What the plan needs of one model under one request on one kind of device, measured once from
    its skeleton: none of it depends on the machine's rooms, so many machines (doctor's bisection
    over memory limits) are planned from one measurement."""

    target: Target
    ask: Ask
    request: PlanRequest
    device: torch.device
    reusable_file: int  # bytes of a layer file that holds these bytes already (0: none to reuse)
    dense_copies: int  # bytes of the 4-bit linears' dense copies the plan may add (0: none)
    layouts: list[LayerLayout]  # the layers as the layer file lays them out
    compact_layouts: list[LayerLayout] | None  # the same with the stored Q6_K linears and Q4_K scales


def measure_model(config: PretrainedConfig, source: SafetensorsSource | None, name: str, dtype: torch.dtype,
                  device: torch.device, request: PlanRequest) -> MeasuredModel:
    """The skeleton of `config` built on the meta device for `device`, and everything the plan
    reads of it (`source` None: sized from the config alone)."""
    model = build_skeleton(config, source, dtype, kernel=device)
    layers_name, layers = decoder_layers(model)
    layouts = [layout_of(layer) for layer in layers]
    reuse = None if source is None else \
        DiskStore(layouts, layer_file(request.offload_dir, name, dtype), fingerprint(source, dtype, device))
    compact = source is not None and q6_head(model, source) is not None
    compact_layouts = None
    if source is not None and has_compact_layers(model, source):
        compact_the_layers(model, source, dtype)  # the skeleton serves the plan only: its dense layouts are taken
        compact_layouts = [layout_of(layer) for layer in layers]
    return measure_layers(model, layers_name, layouts, dtype, device, request, reuse, compact, compact_layouts)


def measure_layers(model: PreTrainedModel, layers_name: str, layouts: list[LayerLayout], dtype: torch.dtype,
                   device: torch.device, request: PlanRequest, disk_store: DiskStore | None,
                   compact_head: bool, compact_layouts: list[LayerLayout] | None) -> MeasuredModel:
    """`compact_head`: the checkpoint also holds the LM head in Q6_K, which the plan may choose;
    `compact_layouts`: the layers' layouts with their Q6_K linears and Q4_K scales as stored, which
    it may choose too (`model`'s layers are then in that form; `layouts` are the dense ones)."""
    sizes = measure_sizes(model, layers_name, layouts, dtype)
    compact_layers = None if compact_layouts is None else measure_sizes(model, layers_name, compact_layouts, dtype)
    reusable = disk_store is not None and disk_store.reusable
    contexts = request.contexts or (model.config.max_position_embeddings,)
    workspace = quantized_workspaces(model, dtype, device, compact_head)
    ask = Ask(contexts, request.drafts, request.tree_tokens, workspace(request.tree_tokens),
              request.placement_request(len(layouts)), cuda=device.type == "cuda",
              smaller_trees=tuple((tree, workspace(tree)) for tree in request.smaller_trees), links=request.links,
              conversations=request.conversations or 1)  # auto plans one, then more (plan/conversations.py)
    compact = compact_fixed(model, sizes.fixed, dtype) if compact_head else None
    target = Target(sizes, shape_of(model.config, dtype), compact, compact_layers)
    if device.type == "cuda":
        target = target.embedding_on_host(host_embedding_bytes(model, dtype))
    copies = dense_copy_bytes(model) if request.dense_copies and device.type == "cpu" else 0
    return MeasuredModel(target, ask, request, device, sizes.file_bytes if reusable else 0, copies, layouts,
                         compact_layouts)


def plan_measured(measured: MeasuredModel, machine: Machine) -> MemoryPlan:
    """The plan of a measured model on `machine`, whose compute device is the measurement's."""
    if machine.device() != measured.device:
        raise ValueError(f"a model measured for {measured.device} planned on a {machine.device()} machine")
    memory = plan_memory(measured.target, measured.ask, machine.tiers(measured.request, measured.reusable_file))
    memory = with_dense_copies(memory, measured.dense_copies)
    layouts = measured.layouts if not memory.compact_layers else measured.compact_layouts
    return with_expert_cache(memory, layouts, measured.device)


def with_expert_cache(plan: MemoryPlan, layouts: list[LayerLayout], device: torch.device) -> MemoryPlan:
    """`plan` with the room left on the device holding the most-routed experts of streamed MoE
    layers, where they would otherwise cross a slower link: PCIe to a GPU, or the disk to a CPU's RAM
    (a CPU's RAM tier is the same memory). As many whole units as the room holds, at most every
    streamed expert; nothing else is displaced."""
    placement = plan.placement
    units = [end - start for index in placement.streamed for start, end in layouts[index].units]
    if not units or not (device.type == "cuda" or placement.disk):
        return plan
    unit = max(units)
    places = min(len(units), max(0, plan.rooms.device - plan.total("device")) // unit)
    if not places:
        return plan
    item = Item("device", EXPERT_CACHE, places * unit)
    return replace(plan, placement=replace(placement, expert_cache=places * unit), items=(*plan.items, item),
                   notes=(*plan.notes, f"the room left holds {places} of the {len(units)} streamed experts: "
                                       "the most routed to wait on the device"))


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


def quantized_workspaces(model: PreTrainedModel, dtype: torch.dtype, device: torch.device,
                         compact_head: bool = False) -> Callable[[int], int]:
    """rows -> the largest temporary a 4-bit linear (quant.int4's bound, over that many input
    rows), a Q6_K one (a layer's chunk buffers, and a layer's or the LM head's product over the rows,
    the head where the plan may keep it so; widened to float32 on a CPU that widens `dtype`) or such
    a CPU's widened dense linear (quant/widened.py) allocates; linears run one at a time, so the
    largest one's. A model whose layers are compact bounds its dense form too: the same 4-bit
    linears. The model is walked once: a MoE has hundreds of thousands of linears in a few shapes."""
    int4 = {(m.in_features, m.out_features, m.group_size, m.kernel, m.perm is not None)
            for m in model.modules() if isinstance(m, Int4Linear)}
    q6_linears = [m for m in model.get_decoder().modules() if isinstance(m, Q6Linear)]
    q6 = max((m.workspace(dtype) for m in q6_linears), default=0)
    q6_shapes = {(m.in_features, m.out_features) for m in q6_linears}
    if compact_head:
        head = model.get_output_embeddings()
        q6_shapes.add((head.in_features, head.out_features))
    widens = device.type == "cpu" and widened_rows(dtype) is not None
    dense = {(m.in_features, m.out_features) for m in model.modules() if type(m) is nn.Linear} if widens else set()

    def at(rows: int) -> int:
        products = (q6_rows(i, o, dtype, rows, widens) for i, o in q6_shapes)
        return max((q6 + max(products, default=0),
                    *(workspace_bytes(i, o, rows, dtype, group, kernel, act_order)
                      for i, o, group, kernel, act_order in int4),
                    *(widened_workspace(i, o, rows) for i, o in dense)))
    return at
