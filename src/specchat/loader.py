"""Loading a run's models once: the memory plan first (from the configs, before anything is
downloaded or loaded), then the target as the plan places it, then the draft as the plan
quantizes it, into one `Models` bundle."""

import math
from collections.abc import Collection
from dataclasses import replace

import torch
from transformers import PreTrainedTokenizerBase

from specchat.cuda_device import unused_gpu
from specchat.decoding.events import AUTO
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.forward import CausalLM
from specchat.decoding.head_rows import measure_head_rows
from specchat.decoding.static_step import draft_slots, static_draft
from specchat.dsi.build import build_ray_workers, default_workers
from specchat.dsi.workers import WorkerPool, parse_devices, thread_workers
from specchat.errors import SpecchatError
from specchat.dtypes import DTYPES
from specchat.models.configs import read_config
from specchat.heap_trim import release_free_heap
from specchat.models.draft import DraftQuant, load_draft
from specchat.models.loading import LoadedModel, load, load_offloaded
from specchat.models.nf4 import draft_quantization
from specchat.models.local import local_tokenizer
from specchat.offload.build import Offload
from specchat.machine_links import read_links
from specchat.offload.placement import Placement
from specchat.offload.streamed_layer import computing_modules
from specchat.offload.host_embedding import host_lookup, keep_embedding_on_host
from specchat.plan import (Machine, MemoryPlan, contexts_for, describe_plan, draft_quant_for, offload_directory,
                          plan_pair, request_for, resolve_weights, stores_4bit)
from specchat.progress import Report, Reporter
from specchat.quant.fp8 import fp8_runs_on
from specchat.quant.int4_dense import keep_dense_copies
from specchat.quant.onednn_float import OneDnnLinear, route_float32_linears
from specchat.quant.prepacked import PrepackedLinear, prepack_linears, widen_linears
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.widened import WidenedLinear
from specchat.engine_options import DRAFTED_ENGINES, EngineOptions
from specchat.runtime import Models, pick_device, validate


def load_models(options: EngineOptions, engines: Collection[str] = (), progress: bool = True,
                report: Report | None = None, conversations: int | None = 1) -> Models:
    """Load what `options.engine` and every engine of `engines` need, once.

    `progress` draws bars on stderr; `report`, if given, also receives every step and fraction;
    `conversations`: the KV caches the plan keeps room for at once (serve's --slots; None: auto).
    """
    names = (options.engine, *engines)
    for name in names:
        validate(options_for(options, name))
    if "dsi" not in names and (options.workers is not None or options.ray_address is not None):
        raise SpecchatError("--workers and --ray-address are for --engine dsi")
    reporter = Reporter(progress, report)
    if "dsi" in names and options.offload == "auto":  # dsi's workers share an in-memory target
        options = replace(options, offload="none")
    options = resolve_weights(options)
    device = pick_device()
    if (unused := unused_gpu()) is not None:
        reporter.notice(unused)
    dtype = DTYPES[options.dtype]
    drafted = any(name in DRAFTED_ENGINES for name in names)
    if drafted:
        draft_quantization(options.draft_quant, device, dtype)  # nf4 without CUDA or bitsandbytes: one line, now
        check_draft_quant(options, device)
    if "dsi" in names and options.ray_address is not None:
        models = load_ray_models(options, device, dtype, reporter)
        draft_quant = draft_quant_for(options, Machine(kind=device.type)) if drafted else None
    else:
        tokenizer = local_tokenizer(options.target, options.weights)  # held before the plan measures
        memory = plan_run(options, device, drafted, reporter, conversations)
        draft_quant = chosen_draft_quant(memory)
        models = load_local_models(options, device, dtype, memory, with_workers="dsi" in names, reporter=reporter,
                                   tokenizer=tokenizer)
    try:
        release_free_heap()  # the target load's temporaries, before the draft's pile on them
        if drafted:
            quantization = draft_quantization(draft_quant.kind, device, dtype)
            models.draft = load_draft(options.draft, device, dtype, quantization, models.tokenizer, reporter,
                                      quant=draft_quant, vocab_size=options.draft_vocab or None)
            if device.type == "cuda":  # a launch-bound step: captured in CUDA graphs per width bucket
                models.draft = static_draft(models.draft, draft_slots(models.context, models.max_budget()),
                                            capture=True, lookup=host_lookup(models.draft.model))
            else:  # its cache grows no further than the plan counts
                models.draft.capacity = draft_slots(models.context, models.max_budget(), pads=0)
        models.identity = identity(options, draft_quant, models.placement, models.memory, dense_products(models.target))
        release_free_heap()  # the draft's: the plan counts what the models hold, not what loading freed
        if options.budget in (AUTO, None) and "specexec" in names:
            probing = "measuring this machine's costs for --budget auto (once per machine and models)"
            reporter.step(probing)
            models.sizer(lambda share: reporter.step(probing, share))
    except BaseException:
        models.close()
        raise
    reporter.step("ready", 1.0)
    return models


def check_draft_quant(options: EngineOptions, device: torch.device) -> None:
    """A draft that stores GPTQ or AWQ weights runs them packed, expanded or expanded into fp8:
    quantizing it otherwise is refused; expanding a draft stored in full weights has nothing to
    expand; fp8 needs a device that multiplies it."""
    if options.draft_quant == "auto":
        return
    if options.draft_quant == "fp8" and not fp8_runs_on(device):
        raise SpecchatError(f"--draft-quant fp8 needs fp8 matrix units (CUDA compute capability 8.9 up: Ada, Hopper); "
                            f"{device} has none: use --draft-quant auto")
    stored = stores_4bit(read_config(options.draft))
    if stored and options.draft_quant not in ("none", "dense", "fp8"):
        raise SpecchatError(f"--draft-quant {options.draft_quant}: {options.draft} stores 4-bit GPTQ or AWQ weights, "
                            "which run packed or expanded: use --draft-quant auto, none, dense or fp8")
    if not stored and options.draft_quant == "dense":
        raise SpecchatError(f"--draft-quant dense expands a draft stored in 4 bits (GPTQ or AWQ); {options.draft} "
                            "stores full weights: use --draft-quant none")


def plan_run(options: EngineOptions, device: torch.device, drafted: bool, reporter: Reporter,
             conversations: int | None = 1) -> MemoryPlan:
    """The whole machine's memory plan for `options` on `device` (`drafted`: with the draft;
    `conversations` kept at once), announced before anything loads."""
    reporter.step("planning memory")
    machine = Machine(kind=device.type)
    memory = plan_pair(*request_for(options, machine, drafted, conversations), machine)
    announce(memory, reporter)
    return memory


def chosen_draft_quant(memory: MemoryPlan) -> DraftQuant | None:
    """The draft's quantization as the plan chose it: its kind, and for int8 whether it keeps the
    dense copies `auto` measured worth keeping (the plan drops them where they do not fit)."""
    if memory.draft is None:
        return None
    return DraftQuant(memory.draft.quant, memory.draft.dense_above, memory.draft_embedding_on_host)


def identity(options: EngineOptions, draft_quant: DraftQuant | None, placement: Placement | None,
             memory: MemoryPlan | None = None, dense: str | None = None) -> dict:
    """What decides the models' costs (`draft_quant` as resolved, the layers' placement as made, the
    Q6_K parts the plan kept compact, how the target's dense linears multiply): the key of the cost
    probe's cache. A placement with nothing streamed costs what none costs."""
    key = {"target": options.target, "draft": options.draft, "dtype": options.dtype, "offload": options.offload,
           "weights": options.weights,
           "resident_layers": options.resident_layers, "draft_vocab": options.draft_vocab,
           "draft_quant": str(draft_quant or options.draft_quant)}
    if placement is not None and placement.streamed:
        key["placement"] = [placement.resident, placement.ram, placement.disk, placement.slots]
        if placement.resident_layers != tuple(range(placement.resident)):  # costs probed with them first are not these
            key["placement"].append("spread")
    elif options.offload == "auto":
        key["offload"] = "none"
    if memory is not None and memory.compact_head:
        key["head"] = "q6_k"
    if memory is not None and memory.compact_layers:
        key["layers"] = "q6_k"
    if dense is not None:
        key["dense"] = dense
    if memory is not None and memory.dense_copies:
        key["wide"] = "dense copies"
    return key


def dense_products(target: CausalLM | None) -> str | None:
    """How the target's dense and Q6_K linears multiply where not as they do alone
    (quant/prepacked.py, quant/onednn_float.py): "prepacked" for oneDNN, "widened" to float32 from some
    rows (and which), float32 through oneDNN over some rows, or None."""
    modules = [] if target is None else computing_modules(target.model)
    if any(isinstance(m, PrepackedLinear) for m in modules):
        return "prepacked"
    widened = {m.from_rows for m in modules if isinstance(m, WidenedLinear)}
    widened |= {m.widened_from for m in modules if isinstance(m, Q6Linear) and m.widened_from != math.inf}
    routed = {m.rows for m in modules if isinstance(m, OneDnnLinear)}
    ways = []
    if widened:
        ways.append(f"widened from {sorted(widened)} rows")
    if routed:
        ways.append(f"oneDNN at {sorted(routed)} rows")
    return "; ".join(ways) or None


def options_for(options: EngineOptions, name: str) -> EngineOptions:
    """`options` as engine `name` reads them: dsi's worker options mean nothing to the others."""
    if name == "dsi":
        return replace(options, engine=name)
    return replace(options, engine=name, workers=None, ray_address=None)


def load_local_models(options: EngineOptions, device: torch.device, dtype: torch.dtype, memory: MemoryPlan,
                      with_workers: bool, reporter: Reporter, tokenizer: PreTrainedTokenizerBase | None = None) -> Models:
    """The target here (in memory or offloaded, as `memory` places it, its `tokenizer` when already
    loaded), and dsi's thread workers over it if asked."""
    target, offload = load_target(options, device, dtype, memory, reporter, tokenizer)
    prepack_linears(target.model, repacking_room(memory))
    if memory.dense_copies:
        reporter.step("expanding dense copies of the 4-bit linears for tree passes")
        keep_dense_copies(target.model, memory.dense_copies)
    computing = computing_modules(target.model)
    widen_linears(computing, device, dtype)
    route_float32_linears(computing, device)
    target_lm = CausalLM(target.model, offload)
    target_lm.head_rows = measure_head_rows(target_lm.logits, target.model.config.hidden_size, dtype, device)
    workers = None
    if with_workers:
        devices = options.workers or default_workers(device)
        reporter.step(f"starting {len(parse_devices(devices))} target workers on {devices}")
        workers = WorkerPool(thread_workers(target_lm, parse_devices(devices)))
    placement = memory.placement if options.offload != "none" else None
    return Models(tokenizer=target.tokenizer, stop_ids=stop_token_ids(target.model, target.tokenizer), device=device,
                  context=memory.context, target=target_lm, offload=offload, placement=placement,
                  workers=workers, memory=memory)


def repacking_room(memory: MemoryPlan) -> int:
    """The bytes the plan leaves free on the device: room for a weight's prepacked copy beside
    the plain one while it is repacked (quant/prepacked.py)."""
    return max(0, memory.rooms.device - memory.total("device"))


def load_ray_models(options: EngineOptions, device: torch.device, dtype: torch.dtype, reporter: Reporter) -> Models:
    """dsi over Ray actors that each load the target: no target here."""
    workers = build_ray_workers(options.target, dtype, options.workers or default_workers(device), options.ray_address,
                                reporter, options.weights)
    context = contexts_for(options.context, workers.max_context)[0]
    return Models(tokenizer=workers.tokenizer, stop_ids=workers.stop_ids, device=device,
                  context=context, target=None, workers=workers.pool)


def load_target(options: EngineOptions, device: torch.device, dtype: torch.dtype, memory: MemoryPlan,
                reporter: Reporter, tokenizer: PreTrainedTokenizerBase | None = None) -> tuple[LoadedModel, Offload | None]:
    """The target in device memory when the plan streams nothing, else with its decoder layers
    placed as the plan says (its LM head in Q6_K where the plan chose it); its input embedding on
    the host where the plan holds it there; its `tokenizer` when already loaded."""
    if not memory.placement.streamed:
        target = load(options.target, dtype, reporter.bars, reporter.report, device=device, weights=options.weights,
                      tokenizer=tokenizer, compact_head=memory.compact_head, compact_layers=memory.compact_layers)
        offload = None
    else:
        target, offload = load_offloaded(options.target, dtype, device, memory.placement, offload_directory(options),
                                         reporter, options.weights, tokenizer, memory.compact_head,
                                         memory.compact_layers)
    if memory.embedding_on_host:
        keep_embedding_on_host(target.model, device, dtype)
    if offload is None:
        reporter.step(f"moving {target.name} to {device.type}")
        target.model.to(device)
    return target, offload


def announce(memory: MemoryPlan, reporter: Reporter) -> None:
    """The plan: on the loading screen always; on stderr too when something streams or auto chose."""
    links = read_links()
    lines = describe_plan(memory, links.ram_gbps, links.disk_gbps)
    loud = memory.placement.streamed or memory.notes
    for line in lines:
        (reporter.notice if loud else reporter.step)(line)
    if memory.placement.disk and links.disk_gbps is None:
        reporter.notice("run `specchat doctor` to measure the disk and see the expected pass time")
