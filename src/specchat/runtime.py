"""User-facing options and their checks, and the loaded models (one `Models` bundle, made by
`loader.load_models`) -> engines over them. The CLI's surface: what it needs of decoding, dsi,
models or the plan it imports from here (marked "for the CLI"), never from those rooms."""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import encode_chat
from specchat.cuda_device import cuda_usable, unused_gpu
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.autosize import AutoSizer, Costs
from specchat.decoding.events import AUTO, Engine, LiveSettings, SamplingParams  # SamplingParams: for the CLI
from specchat.decoding.probe import Done, probe_costs
from specchat.decoding.forward import CausalLM
from specchat.decoding.guide import Grammars
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.dsi.build import default_workers  # for the CLI
from specchat.dsi.engine import DSIEngine
from specchat.dsi.remote import import_ray
from specchat.dsi.workers import WorkerPool, parse_devices
from specchat.errors import SpecchatError
from specchat.limits import (BUDGET, CONTEXT, DEFAULT_DRAFT_VOCAB, DEFAULT_DTYPE, DEFAULT_LOOKAHEAD, DEFAULT_MAX_DEPTH,
                             DEFAULT_OFFLOAD, DEPTH, DTYPES, LOOKAHEAD, OFFLOAD_TIERS, auto_cap, check_memory_budgets,
                             default_budget)
from specchat.models.loading import check_not_pickled, has_int4, resolve
from specchat.models.listing import list_models  # for the CLI
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.plan import Machine, MemoryPlan  # Machine: for the CLI
from specchat.offload.build import Offload
from specchat.offload.placement import Placement
from specchat.probe_cache import probe_path, probed_costs

ENGINES = ("autoregressive", "specexec", "sd", "specinfer", "dsi")
DRAFTED_ENGINES = ("specexec", "sd", "specinfer", "dsi")  # engines that need a draft model
DRAFT_QUANTS = ("auto", "none", "int8", "int4", "nf4", "dense")
WEIGHTS = ("auto", "quantized", "dense")


@dataclass(frozen=True)
class EngineOptions:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    engine: str = "specexec"
    budget: int | str | None = None  # K, or AUTO (sized per iteration); None: AUTO for specexec, else suited to the device
    max_depth: int = DEFAULT_MAX_DEPTH
    dtype: str = DEFAULT_DTYPE
    weights: str = "auto"  # the target's: quantized (its stored 4-bit weights, packed), dense, auto (quantized unless float32)
    offload: str = DEFAULT_OFFLOAD  # where the target's decoder layers live: auto, none (on the device), ram, disk
    offload_dir: str | None = None  # the disk tier's layer file; None: the user cache dir
    resident_layers: int | None = None  # layers kept on the device when offloading; None: what fits
    ram_budget: float | None = None  # GB of RAM specchat may take; None: what is available
    vram_budget: float | None = None  # GB of GPU memory specchat may take (all of it); None: what is free
    context: int | None = None  # tokens of KV room; None: limits.DEFAULT_CONTEXT, which auto may shrink
    # auto: int8 on a CPU for the widths where it pays; on a GPU full weights, int4 or nf4 by predicted speed;
    # int4: rounded to 4 bits and run packed (quant/int4_rtn.py); nf4: bitsandbytes 4-bit (CUDA only)
    draft_quant: str = "auto"
    draft_vocab: int = DEFAULT_DRAFT_VOCAB  # the draft's LM head scores this many tokens; 0: all
    lookahead: int = DEFAULT_LOOKAHEAD  # dsi: drafts per verification job
    workers: str | None = None  # dsi: target workers' devices, e.g. cpu,cpu; None: two on the device
    ray_address: str | None = None  # dsi: run the workers as actors of this Ray cluster
    allow_pickle: bool = False  # load local checkpoints whose weights are pickles (.bin, .pt)
    ranked_tree: bool = False  # measurement only: trees by rank, full whatever the draft (tree.TreeShape)


@dataclass
class Models:
    """Everything one run loads, once: used by run, generate, bench and serve, which build their
    engines from it and never load anything themselves."""

    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    device: torch.device
    context: int  # the KV room the plan reserved: prompt and reply together
    target: CausalLM | None  # None when dsi's Ray actors hold the target
    draft: CausalLM | None = None  # None when no engine to run drafts
    offload: Offload | None = None
    placement: Placement | None = None  # where the target's layers went (None: --offload none)
    workers: WorkerPool | None = None  # dsi's target workers
    identity: dict = field(default_factory=dict)  # what was loaded and how: the cost probe's key
    costs: Costs | None = None  # --budget auto's measured costs, once probed
    memory: MemoryPlan | None = None  # every byte the run holds (None: dsi's Ray actors plan their own)
    compiler: Grammars | None = None  # grammars(): built once, when a reply first asks for a form

    def grammars(self) -> Grammars:
        """The compiler of grammars over this target's tokenizer and vocabulary (built at first use: ~1 s)."""
        if self.compiler is None:
            vocab = self.target.model.config.vocab_size if self.target is not None else len(self.tokenizer)
            self.compiler = Grammars(self.tokenizer, vocab, self.stop_ids)
        return self.compiler

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
        ranked = bool(settings.ranked_tree)
        if name != "specexec":  # only SpecExec sizes its own trees: the others take the device's default
            budget = default_budget(cuda, offloaded) if budget == AUTO else budget
            return TreeEngine(TREE_STRATEGIES[name], self.target, self.draft, self.stop_ids,
                              TreeShape(budget=budget, max_depth=depth, ranked_tree=ranked))
        sizer = self.sizer() if budget == AUTO or self.costs is not None else None
        shape = TreeShape(budget=sizer.cap, max_depth=depth, sizer=sizer, ranked_tree=ranked) if budget == AUTO else \
            TreeShape(budget=budget, max_depth=depth, ranked_tree=ranked)
        return TreeEngine(SPECEXEC, self.target, self.draft, self.stop_ids, shape, sizer)

    def sizer(self, done: Done = lambda share: None) -> AutoSizer:
        """A fresh --budget auto sizer over this pair's costs, probed on first use (and kept in
        the user cache for the next run on this machine; probed again at a quiet startup when
        they were probed under load); `done` hears how far a probe has got."""
        if self.costs is None:
            self.costs = probed_costs(probe_path(self.device, self.identity),
                                      lambda: probe_costs(self.target, self.draft, self.auto_cap(), done))
        return AutoSizer(self.costs, self.auto_cap())

    def auto_cap(self) -> int:
        """auto's largest tree: the device's cap, or the smaller tree the memory plan made room for."""
        return min(auto_cap(cuda=self.device.type == "cuda", offloaded=self.offload is not None), self.max_budget())

    def max_budget(self) -> int:
        """The largest draft tree the memory plan made room for (its pass scores the root too)."""
        return BUDGET.high if self.memory is None else int(self.memory.tree_tokens) - 1

    def transfer_label(self) -> str:
        return transfer_label(self.device.type, self.placement)

    def close(self) -> None:
        """Stop the weight streamer's loader thread and close the layer file; stop DSI's workers."""
        if self.offload is not None:
            self.offload.close()
        if self.workers is not None:
            self.workers.close()


TREE_STRATEGIES = {strategy.name: strategy for strategy in (SPECEXEC, CHAIN_SD, SPECINFER)}


def transfer_label(device_type: str, placement: Placement | None) -> str:
    """Where streamed weights travel from, as the panels name it; "" when nothing streams."""
    if placement is None or not placement.streamed:
        return ""
    if device_type == "cuda":
        return "PCIe"
    return "disk" if placement.disk else "RAM"


def pick_device() -> torch.device:
    """The GPU where specchat's kernels run on it (cuda_device.py), else the CPU."""
    return torch.device("cuda" if cuda_usable() else "cpu")


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
    if options.context is not None:
        CONTEXT.check("--context", options.context)
    if options.weights not in WEIGHTS:
        raise SpecchatError(f"unknown weights '{options.weights}': choose one of {', '.join(WEIGHTS)}")
    if options.weights == "quantized" and not has_int4(resolve(options.target)):
        raise SpecchatError(f"--weights quantized runs a target from the 4-bit weights it stores, and {options.target} "
                            "stores none that specchat multiplies packed (GPTQ and AWQ checkpoints always run so): "
                            "use --weights dense or auto")
    if options.offload not in OFFLOAD_TIERS:
        raise SpecchatError(f"unknown offload tier '{options.offload}': choose one of {', '.join(OFFLOAD_TIERS)}")
    if options.resident_layers is not None and options.resident_layers < 0:
        raise SpecchatError(f"--resident-layers must be >= 0 (got {options.resident_layers})")
    check_memory_budgets(options.ram_budget, options.vram_budget)
    if options.offload == "none" and (options.ram_budget is not None or options.vram_budget is not None):
        name = "--ram-budget" if options.ram_budget is not None else "--vram-budget"
        raise SpecchatError(f"{name} caps where offloaded layers go: use it with --offload auto, ram or disk")
    if options.vram_budget is not None and not cuda_usable():
        why = unused_gpu() or "torch sees no GPU here"
        raise SpecchatError(f"--vram-budget caps GPU memory, and {why}: use --ram-budget")
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


def live_settings_of(options: EngineOptions) -> LiveSettings:
    """The engine settings named on the command line (a None budget: suited to the device)."""
    return LiveSettings(budget=options.budget, depth=options.max_depth, lookahead=options.lookahead,
                        ranked_tree=options.ranked_tree)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, raw: bool) -> list[int]:
    """Token ids of a single-turn chat (the model's chat template), or of `prompt` as is."""
    if raw or tokenizer.chat_template is None:
        ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    else:
        ids = encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    if not ids:
        raise SpecchatError("the prompt is empty after tokenization: give some text")
    return ids
