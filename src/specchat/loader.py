"""Loading a run's models once: the memory plan first (from the configs, before anything is
downloaded or loaded), then the target as the plan places it, then the draft as the plan
quantizes it, into one `Models` bundle."""

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from specchat.decoding.events import AUTO
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.forward import CausalLM
from specchat.decoding.static_step import BUCKETS, static_draft
from specchat.dsi.build import build_ray_workers, default_workers
from specchat.dsi.workers import WorkerPool, parse_devices, thread_workers
from specchat.errors import SpecchatError
from specchat.models.configs import read_config
from specchat.heap_trim import release_free_heap
from specchat.models.draft import DraftQuant, load_draft, resolve_draft_quant
from specchat.models.loading import LoadedModel, has_int4, load, load_offloaded, resolve
from specchat.models.nf4 import draft_quantization
from specchat.models.local import local_tokenizer
from specchat.offload.build import Offload
from specchat.machine_links import read_links
from specchat.offload.placement import Placement
from specchat.plan import (Machine, MemoryPlan, Pair, PlanRequest, contexts_for, describe_plan, draft_kinds, plan_pair,
                          stores_4bit, tree_sizes)
from specchat.paths import offload_dir as default_offload_dir
from specchat.progress import Report, Reporter
from specchat.quant.int4_dense import keep_dense_copies
from specchat.quant.prepacked import PrepackedLinear, prepack_linears
from specchat.runtime import DRAFTED_ENGINES, DTYPES, EngineOptions, Models, pick_device, validate
from specchat.transfer import gb_to_bytes


def load_models(options: EngineOptions, engines: Collection[str] = (), progress: bool = True,
                report: Report | None = None) -> Models:
    """Load what `options.engine` and every engine of `engines` need, once.

    `progress` draws bars on stderr; `report`, if given, also receives every step and fraction.
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
    dtype = DTYPES[options.dtype]
    drafted = any(name in DRAFTED_ENGINES for name in names)
    if drafted:
        draft_quantization(options.draft_quant, device, dtype)  # nf4 without CUDA or bitsandbytes: one line, now
        check_draft_quant(options)
    measured = resolve_draft_quant(options.draft_quant, device, dtype) if drafted else None
    if "dsi" in names and options.ray_address is not None:
        models, draft_quant = load_ray_models(options, device, dtype, reporter), measured
    else:
        tokenizer = local_tokenizer(options.target, int4_target(options))  # held before the plan measures
        memory = plan_run(options, device, dtype, measured, reporter)
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
                models.draft = static_draft(models.draft, models.context + models.max_budget() + BUCKETS[-1],
                                            capture=True)
        models.identity = identity(options, draft_quant, models.placement, models.memory, prepacked(models.target))
        release_free_heap()  # the draft's: the plan counts what the models hold, not what loading freed
        if options.budget in (AUTO, None) and "specexec" in names:
            reporter.step("measuring this machine's costs for --budget auto (once per machine and models)")
            models.sizer()
    except BaseException:
        models.close()
        raise
    reporter.step("ready", 1.0)
    return models


def check_draft_quant(options: EngineOptions) -> None:
    """A draft that stores GPTQ or AWQ weights runs them packed: quantizing it again is refused."""
    if options.draft_quant in ("auto", "none") or not stores_4bit(read_config(options.draft)):
        return
    raise SpecchatError(f"--draft-quant {options.draft_quant}: {options.draft} stores 4-bit GPTQ or AWQ weights, "
                        "which run packed: use --draft-quant auto or none")


def plan_run(options: EngineOptions, device: torch.device, dtype: torch.dtype, measured: DraftQuant | None,
             reporter: Reporter) -> MemoryPlan:
    """The whole machine's memory plan for `options`, announced before anything loads; `measured`:
    the draft's quantization as `auto` resolved it on this device (None: no draft)."""
    reporter.step("planning memory")
    memory = plan_pair(pair_of(options, dtype, device, measured), plan_request(options, device),
                        Machine(kind=device.type))
    announce(memory, reporter)
    return memory


def pair_of(options: EngineOptions, dtype: torch.dtype, device: torch.device, measured: DraftQuant | None) -> Pair:
    """The target and draft `options` name, as the plan weighs them (no draft when `measured` is None)."""
    draft = {} if measured is None else {
        "draft": options.draft, "draft_kinds": draft_kinds(options.draft_quant, device, measured.kind),
        "dense_above": measured.dense_above, "draft_vocab": options.draft_vocab or None}
    return Pair(options.target, dtype, int4_target(options), context=options.context, **draft)


def chosen_draft_quant(memory: MemoryPlan) -> DraftQuant | None:
    """The draft's quantization as the plan chose it: its kind, and for int8 whether it keeps the
    dense copies `auto` measured worth keeping (the plan drops them where they do not fit)."""
    if memory.draft is None:
        return None
    return DraftQuant(memory.draft.quant, memory.draft.dense_above)


def identity(options: EngineOptions, draft_quant: DraftQuant | None, placement: Placement | None,
             memory: MemoryPlan | None = None, dense_prepacked: bool = False) -> dict:
    """What decides the models' costs (`draft_quant` as resolved, the layers' placement as made, the
    Q6_K parts the plan kept compact, the target's dense linears prepacked): the key of the cost
    probe's cache. A placement with nothing streamed costs what none costs."""
    key = {"target": options.target, "draft": options.draft, "dtype": options.dtype, "offload": options.offload,
           "weights": options.weights,
           "resident_layers": options.resident_layers, "draft_vocab": options.draft_vocab,
           "draft_quant": str(draft_quant or options.draft_quant)}
    if placement is not None and placement.streamed:
        key["placement"] = [placement.resident, placement.ram, placement.disk, placement.slots]
    elif options.offload == "auto":
        key["offload"] = "none"
    if memory is not None and memory.compact_head:
        key["head"] = "q6_k"
    if memory is not None and memory.compact_layers:
        key["layers"] = "q6_k"
    if dense_prepacked:
        key["dense"] = "prepacked"
    if memory is not None and memory.dense_copies:
        key["wide"] = "dense copies"
    return key


def prepacked(target: CausalLM | None) -> bool:
    """Whether any of the target's dense linears were prepacked for oneDNN (quant/prepacked.py)."""
    return target is not None and any(isinstance(m, PrepackedLinear) for m in target.model.modules())


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
    target_lm = CausalLM(target.model, offload)
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
                                reporter, int4_target(options))
    context = contexts_for(options.context, workers.max_context)[0]
    return Models(tokenizer=workers.tokenizer, stop_ids=workers.stop_ids, device=device,
                  context=context, target=None, workers=workers.pool)


def load_target(options: EngineOptions, device: torch.device, dtype: torch.dtype, memory: MemoryPlan,
                reporter: Reporter, tokenizer: PreTrainedTokenizerBase | None = None) -> tuple[LoadedModel, Offload | None]:
    """The target in device memory when the plan streams nothing, else with its decoder layers
    placed as the plan says (its LM head in Q6_K where the plan chose it); its `tokenizer` when
    already loaded."""
    int4 = int4_target(options)
    if not memory.placement.streamed:
        target = load(options.target, dtype, reporter.bars, reporter.report, device=device, int4=int4,
                      tokenizer=tokenizer, compact_head=memory.compact_head, compact_layers=memory.compact_layers)
        reporter.step(f"moving {target.name} to {device.type}")
        target.model.to(device)
        return target, None
    return load_offloaded(options.target, dtype, device, memory.placement, offload_directory(options), reporter,
                          int4, tokenizer, memory.compact_head, memory.compact_layers)


def resolve_weights(options: EngineOptions) -> EngineOptions:
    """`options` with --weights decided, once, before anything loads: `auto` runs the target from
    the 4-bit weights it stores ("quantized") whenever it has them, except in float32, which keeps
    the dense path that the exactness tests compare with transformers. Below this the choice is
    `options.weights == "quantized"`, and the `int4` flag of the plan and the loaders."""
    if options.weights != "auto":
        return options
    int4 = options.dtype != "float32" and has_int4(resolve(options.target))
    return replace(options, weights="quantized" if int4 else "dense")


def int4_target(options: EngineOptions) -> bool:
    """Whether `options` (their --weights decided by `resolve_weights`) run the target's 4-bit weights."""
    if options.weights == "auto":
        raise ValueError("--weights auto is decided once by resolve_weights before it is read")
    return options.weights == "quantized"


def plan_request(options: EngineOptions, device: torch.device) -> PlanRequest:
    """The offload options and the largest tree: the auto cap, or an explicit --budget past it."""
    cuda = device.type == "cuda"
    tree_tokens, smaller_trees = tree_sizes(cuda, options.budget if isinstance(options.budget, int) else 0)
    return PlanRequest(tier=options.offload, offload_dir=offload_directory(options),
                       resident_layers=options.resident_layers, ram_budget=gb_to_bytes(options.ram_budget),
                       vram_budget=gb_to_bytes(options.vram_budget), tree_tokens=tree_tokens,
                       smaller_trees=smaller_trees, dense_copies=int4_target(options) and not cuda)


def offload_directory(options: EngineOptions) -> Path:
    """--offload-dir, or the default in the user's cache."""
    return Path(options.offload_dir).expanduser() if options.offload_dir else default_offload_dir()


def announce(memory: MemoryPlan, reporter: Reporter) -> None:
    """The plan: on the loading screen always; on stderr too when something streams or auto chose."""
    links = read_links()
    lines = describe_plan(memory, links.ram_gbps, links.disk_gbps)
    loud = memory.placement.streamed or memory.notes
    for line in lines:
        (reporter.notice if loud else reporter.step)(line)
    if memory.placement.disk and links.disk_gbps is None:
        reporter.notice("run `specchat doctor` to measure the disk and see the expected pass time")
