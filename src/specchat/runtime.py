"""User-facing options -> the loaded models (one `Models` bundle) -> engines over them."""

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import ChainSDEngine
from specchat.decoding.drafter import TreeShape
from specchat.decoding.autosize import AutoSizer, Costs
from specchat.decoding.events import AUTO, Engine, LiveSettings
from specchat.decoding.probe import probe_costs
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SpecExecEngine
from specchat.decoding.specinfer import SpecInferEngine
from specchat.decoding.stopping import stop_token_ids
from specchat.dsi.build import build_ray_workers, default_workers
from specchat.dsi.engine import DSIEngine
from specchat.dsi.remote import import_ray
from specchat.dsi.workers import WorkerPool, parse_devices, thread_workers
from specchat.errors import SpecchatError
from specchat.limits import (BUDGET, DEFAULT_DRAFT_VOCAB, DEFAULT_DTYPE, DEFAULT_LOOKAHEAD, DEFAULT_MAX_DEPTH,
                             DEFAULT_OFFLOAD, DEPTH, LOOKAHEAD, MEMORY_BUDGET_GB, OFFLOAD_TIERS, auto_cap, default_budget)
from specchat.models.draft import DraftQuant, load_draft, resolve_draft_quant
from specchat.models.loading import LoadedModel, check_not_pickled, load, load_offloaded, plan_target, resolve
from specchat.models.nf4 import draft_quantization
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.offload.build import Offload, OffloadPlan
from specchat.offload.links import read_links
from specchat.offload.placement import Placement
from specchat.paths import cache_dir
from specchat.probe_cache import probe_path, read_costs, write_costs
from specchat.progress import Report, Reporter

ENGINES = ("autoregressive", "specexec", "sd", "specinfer", "dsi")
DRAFTED_ENGINES = ("specexec", "sd", "specinfer", "dsi")  # engines that need a draft model
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DRAFT_QUANTS = ("auto", "none", "int8", "nf4")


@dataclass(frozen=True)
class EngineOptions:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    engine: str = "specexec"
    budget: int | str | None = None  # K, or AUTO (sized per iteration); None: AUTO for specexec, else suited to the device
    max_depth: int = DEFAULT_MAX_DEPTH
    dtype: str = DEFAULT_DTYPE
    offload: str = DEFAULT_OFFLOAD  # where the target's decoder layers live: auto, none (on the device), ram, disk
    offload_dir: str | None = None  # the disk tier's layer file; None: the user cache dir
    resident_layers: int | None = None  # layers kept on the device when offloading; None: what fits
    ram_budget: float | None = None  # GB of RAM the target may take; None: what is available
    vram_budget: float | None = None  # GB of GPU memory the target may take; None: what is free
    draft_quant: str = "auto"  # auto: int8 on a CPU for the widths where it pays, none elsewhere; nf4: bitsandbytes 4-bit (CUDA only)
    draft_vocab: int = DEFAULT_DRAFT_VOCAB  # the draft's LM head scores this many tokens; 0: all
    lookahead: int = DEFAULT_LOOKAHEAD  # dsi: drafts per verification job
    workers: str | None = None  # dsi: target workers' devices, e.g. cpu,cpu; None: two on the device
    ray_address: str | None = None  # dsi: run the workers as actors of this Ray cluster
    allow_pickle: bool = False  # load local checkpoints whose weights are pickles (.bin, .pt)


@dataclass
class Models:
    """Everything one run loads, once: used by run, generate, bench and serve, which build their
    engines from it and never load anything themselves."""

    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    device: torch.device
    context_tokens: int  # the target's context length
    target: CausalLM | None  # None when dsi's Ray actors hold the target
    draft: CausalLM | None = None  # None when no engine to run drafts
    offload: Offload | None = None
    placement: Placement | None = None  # where the target's layers went (None: --offload none)
    workers: WorkerPool | None = None  # dsi's target workers
    identity: dict = field(default_factory=dict)  # what was loaded and how: the cost probe's key
    costs: Costs | None = None  # --budget auto's measured costs, once probed

    def engine_names(self) -> tuple[str, ...]:
        """The engines these models can run."""
        with_target = ("autoregressive",) if self.target is not None else ()
        trees = ("specexec", "sd", "specinfer") if self.target is not None and self.draft is not None else ()
        dsi = ("dsi",) if self.workers is not None and self.draft is not None else ()
        return with_target + trees + dsi

    def engine(self, name: str, settings: LiveSettings = LiveSettings()) -> Engine:
        """A new engine `name` over these models, with `settings` (None fields: the defaults)."""
        if name not in self.engine_names():
            raise SpecchatError(f"engine '{name}' cannot run on the loaded models: choose one of "
                                f"{', '.join(self.engine_names())}")
        if name == "autoregressive":
            return AutoregressiveEngine(self.target, self.stop_ids)
        if name == "dsi":
            lookahead = settings.lookahead if settings.lookahead is not None else DEFAULT_LOOKAHEAD
            return DSIEngine(self.draft, self.workers, self.stop_ids, lookahead)
        cuda, offloaded = self.device.type == "cuda", self.offload is not None
        depth = settings.depth if settings.depth is not None else DEFAULT_MAX_DEPTH
        budget = AUTO if settings.budget is None else settings.budget  # SpecExec sizes its trees by default
        if name != "specexec":  # only SpecExec sizes its own trees: the others take the device's default
            budget = default_budget(cuda, offloaded) if budget == AUTO else budget
            return TREE_ENGINES[name](self.target, self.draft, self.stop_ids, TreeShape(budget=budget, max_depth=depth))
        sizer = self.sizer() if budget == AUTO or self.costs is not None else None
        shape = TreeShape(budget=sizer.cap, max_depth=depth, sizer=sizer) if budget == AUTO else \
            TreeShape(budget=budget, max_depth=depth)
        return SpecExecEngine(self.target, self.draft, self.stop_ids, shape, sizer)

    def sizer(self) -> AutoSizer:
        """A fresh --budget auto sizer over this pair's costs, probed on first use (and kept in
        the user cache for the next run on this machine)."""
        if self.costs is None:
            path = probe_path(self.device, self.identity)
            self.costs = read_costs(path)
            if self.costs is None:
                self.costs = probe_costs(self.target, self.draft, self.auto_cap())
                write_costs(path, self.costs)
        return AutoSizer(self.costs, self.auto_cap())

    def auto_cap(self) -> int:
        return auto_cap(cuda=self.device.type == "cuda", offloaded=self.offload is not None)

    def close(self) -> None:
        """Stop the weight streamer's loader thread and close the layer file; stop DSI's workers."""
        if self.offload is not None:
            self.offload.close()
        if self.workers is not None:
            self.workers.close()


TREE_ENGINES = {"specexec": SpecExecEngine, "sd": ChainSDEngine, "specinfer": SpecInferEngine}


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def validate(options: EngineOptions) -> None:
    """Check what can be checked before loading anything; one clear line on failure."""
    if options.engine not in ENGINES:
        raise SpecchatError(f"unknown engine '{options.engine}': choose one of {', '.join(ENGINES)}")
    if options.dtype not in DTYPES:
        raise SpecchatError(f"unknown dtype '{options.dtype}': choose one of {', '.join(DTYPES)}")
    if options.budget is not None and options.budget != AUTO:
        BUDGET.check("--budget", options.budget)
    if options.budget == AUTO and options.engine in ("sd", "specinfer"):
        raise SpecchatError(f"--budget auto is for the specexec engine, not {options.engine}")
    DEPTH.check("--max-depth", options.max_depth)
    if options.offload not in OFFLOAD_TIERS:
        raise SpecchatError(f"unknown offload tier '{options.offload}': choose one of {', '.join(OFFLOAD_TIERS)}")
    if options.resident_layers is not None and options.resident_layers < 0:
        raise SpecchatError(f"--resident-layers must be >= 0 (got {options.resident_layers})")
    for name, value in (("--ram-budget", options.ram_budget), ("--vram-budget", options.vram_budget)):
        if value is not None:
            MEMORY_BUDGET_GB.check(name, value)
            if options.offload == "none":
                raise SpecchatError(f"{name} caps where offloaded layers go: use it with --offload auto, ram or disk")
    if options.offload_dir is not None and Path(options.offload_dir).expanduser().is_file():
        raise SpecchatError(f"--offload-dir {options.offload_dir} is a file, not a directory")
    if options.draft_quant not in DRAFT_QUANTS:
        raise SpecchatError(f"unknown draft quantization '{options.draft_quant}': choose one of {', '.join(DRAFT_QUANTS)}")
    if options.draft_vocab < 0:
        raise SpecchatError(f"--draft-vocab must be >= 0, 0 for the whole vocabulary (got {options.draft_vocab})")
    validate_dsi(options)
    specs = (options.target, options.draft) if options.engine in DRAFTED_ENGINES else (options.target,)
    for spec in specs:
        resolve(spec)
        if not options.allow_pickle:
            check_not_pickled(spec)


def validate_dsi(options: EngineOptions) -> None:
    LOOKAHEAD.check("--lookahead", options.lookahead)
    if options.engine != "dsi":
        if options.ray_address is not None or options.workers is not None:
            raise SpecchatError("--workers and --ray-address are for --engine dsi")
        return
    if options.offload not in ("none", "auto"):  # auto: in memory, as dsi needs
        raise SpecchatError("--engine dsi keeps a target on every worker: use --offload none")
    if options.workers is not None:
        parse_devices(options.workers)
    if options.ray_address is not None:
        import_ray()


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
    device = pick_device()
    dtype = DTYPES[options.dtype]
    drafted = any(name in DRAFTED_ENGINES for name in names)
    quantization = draft_quantization(options.draft_quant, device, dtype) if drafted else None
    draft_quant = resolve_draft_quant(options.draft_quant, device, dtype) if drafted else None
    if "dsi" in names and options.ray_address is not None:
        models = load_ray_models(options, device, dtype, reporter)
    else:
        models = load_local_models(options, device, dtype, with_workers="dsi" in names, reporter=reporter)
    try:
        if drafted:
            models.draft = load_draft(options.draft, device, dtype, quantization, models.tokenizer, reporter,
                                      quant=draft_quant, vocab_size=options.draft_vocab or None)
        models.identity = identity(options, draft_quant, models.placement)
        if options.budget in (AUTO, None) and "specexec" in names:
            reporter.step("measuring this machine's costs for --budget auto (once per machine and models)")
            models.sizer()
    except BaseException:
        models.close()
        raise
    reporter.step("ready", 1.0)
    return models


def identity(options: EngineOptions, draft_quant: DraftQuant | None, placement: Placement | None) -> dict:
    """What decides the models' costs (`draft_quant` as resolved, the layers' placement as made):
    the key of the cost probe's cache. A placement with nothing streamed costs what none costs."""
    key = {"target": options.target, "draft": options.draft, "dtype": options.dtype, "offload": options.offload,
           "resident_layers": options.resident_layers, "draft_vocab": options.draft_vocab,
           "draft_quant": str(draft_quant or options.draft_quant)}
    if placement is not None and placement.streamed:
        key["placement"] = [placement.resident, placement.ram, placement.disk, placement.slots]
    elif options.offload == "auto":
        key["offload"] = "none"
    return key


def options_for(options: EngineOptions, name: str) -> EngineOptions:
    """`options` as engine `name` reads them: dsi's worker options mean nothing to the others."""
    if name == "dsi":
        return replace(options, engine=name)
    return replace(options, engine=name, workers=None, ray_address=None)


def load_local_models(options: EngineOptions, device: torch.device, dtype: torch.dtype, with_workers: bool,
                      reporter: Reporter) -> Models:
    """The target here (in memory or offloaded), and dsi's thread workers over it if asked."""
    target, offload, placement = load_target(options, device, dtype, reporter)
    target_lm = CausalLM(target.model, offload)
    workers = None
    if with_workers:
        devices = options.workers or default_workers(device)
        reporter.step(f"starting {len(parse_devices(devices))} target workers on {devices}")
        workers = WorkerPool(thread_workers(target_lm, parse_devices(devices)))
    return Models(tokenizer=target.tokenizer, stop_ids=stop_token_ids(target.model, target.tokenizer), device=device,
                  context_tokens=target.model.config.max_position_embeddings, target=target_lm, offload=offload,
                  placement=placement, workers=workers)


def load_ray_models(options: EngineOptions, device: torch.device, dtype: torch.dtype, reporter: Reporter) -> Models:
    """dsi over Ray actors that each load the target: no target here."""
    workers = build_ray_workers(options.target, dtype, options.workers or default_workers(device), options.ray_address,
                            reporter)
    return Models(tokenizer=workers.tokenizer, stop_ids=workers.stop_ids, device=device,
                  context_tokens=workers.context_tokens, target=None, workers=workers.pool)


def live_settings_of(options: EngineOptions) -> LiveSettings:
    """The engine settings named on the command line (a None budget: suited to the device)."""
    return LiveSettings(budget=options.budget, depth=options.max_depth, lookahead=options.lookahead)


def load_target(options: EngineOptions, device: torch.device, dtype: torch.dtype,
                reporter: Reporter) -> tuple[LoadedModel, Offload | None, Placement | None]:
    """The target in device memory, or with its decoder layers placed by `options.offload`
    (auto: as the placement decides; everything resident loads as with none)."""
    if options.offload == "none":
        return load_in_memory(options.target, device, dtype, reporter), None, None
    plan = offload_plan(options, device)
    placement = plan_target(options.target, dtype, device, plan, reporter)
    announce(placement, reporter)
    if options.offload == "auto" and not placement.streamed:
        return load_in_memory(options.target, device, dtype, reporter), None, placement
    target, offload = load_offloaded(options.target, dtype, device, plan, reporter, placement)
    return target, offload, placement


def load_in_memory(spec: str, device: torch.device, dtype: torch.dtype, reporter: Reporter) -> LoadedModel:
    target = load(spec, dtype, reporter.bars, reporter.report)
    reporter.step(f"moving {target.name} to {device.type}")
    target.model.to(device)
    return target


def offload_plan(options: EngineOptions, device: torch.device) -> OffloadPlan:
    return OffloadPlan(
        tier=options.offload,
        offload_dir=Path(options.offload_dir).expanduser() if options.offload_dir else cache_dir() / "offload",
        resident_layers=options.resident_layers,
        ram_budget=gb_to_bytes(options.ram_budget),
        vram_budget=gb_to_bytes(options.vram_budget),
        tree_tokens=auto_cap(cuda=device.type == "cuda", offloaded=True),
    )


def gb_to_bytes(value: float | None) -> int | None:
    return None if value is None else int(value * 1e9)


def announce(placement: Placement, reporter: Reporter) -> None:
    """The plan as one line: on the loading screen always, on stderr when something streams."""
    links = read_links()
    text = "offload plan: " + placement.describe(links.ram_gbps, links.disk_gbps)
    if placement.streamed and links.disk_gbps is None and placement.disk:
        text += " (run `specchat doctor` to measure the disk and see the expected pass time)"
    (reporter.notice if placement.streamed else reporter.step)(text)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, raw: bool) -> list[int]:
    """Token ids of a single-turn chat (the model's chat template), or of `prompt` as is."""
    if raw or tokenizer.chat_template is None:
        ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    else:
        ids = encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    if not ids:
        raise SpecchatError("the prompt is empty after tokenization: give some text")
    return ids
