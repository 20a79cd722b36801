"""The options every engine command takes (run, generate, serve, bench), the names they choose
among, and the checks their values alone decide. Nothing here imports torch or transformers, so
the command line parses its options, and answers --help or a mistyped option, before the heavy
modules load (runtime.validate then checks what the values name on this machine)."""

from dataclasses import dataclass

from specchat.decoding.events import AUTO, SamplingParams  # for the CLI (torch-free: the protocol's types)
from specchat.errors import SpecchatError
from specchat.paths import expanded
from specchat.limits import (BUDGET, CONTEXT, DEFAULT_DRAFT_VOCAB, DEFAULT_DTYPE, DEFAULT_LOOKAHEAD, DEFAULT_MAX_DEPTH,
                             DEFAULT_OFFLOAD, DEPTH, DTYPE_NAMES, LOOKAHEAD, OFFLOAD_TIERS, check_memory_budgets)
from specchat.models.listing import list_models, table_lines  # for the CLI: `specchat models` without torch
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.models.spec import check_models

ENGINES = ("autoregressive", "specexec", "sd", "specinfer", "dsi")
DRAFTED_ENGINES = ("specexec", "sd", "specinfer", "dsi")  # engines that need a draft model
DRAFT_QUANTS = ("auto", "none", "int8", "int4", "nf4", "dense", "fp8")
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


def check_values(options: EngineOptions) -> None:
    """The names, ranges and combinations of the values; one clear line on failure."""
    if options.engine not in ENGINES:
        raise SpecchatError(f"unknown engine '{options.engine}': choose one of {', '.join(ENGINES)}")
    if options.dtype not in DTYPE_NAMES:
        raise SpecchatError(f"unknown dtype '{options.dtype}': choose one of {', '.join(DTYPE_NAMES)}")
    if options.budget is not None and options.budget != AUTO:
        BUDGET.check("--budget", options.budget)
    if options.budget == AUTO and options.engine in ("sd", "specinfer"):
        raise SpecchatError(f"--budget auto is for the specexec engine, not {options.engine}")
    DEPTH.check("--max-depth", options.max_depth)
    if options.context is not None:
        CONTEXT.check("--context", options.context)
    if options.weights not in WEIGHTS:
        raise SpecchatError(f"unknown weights '{options.weights}': choose one of {', '.join(WEIGHTS)}")
    if options.offload not in OFFLOAD_TIERS:
        raise SpecchatError(f"unknown offload tier '{options.offload}': choose one of {', '.join(OFFLOAD_TIERS)}")
    if options.resident_layers is not None and options.resident_layers < 0:
        raise SpecchatError(f"--resident-layers must be >= 0 (got {options.resident_layers})")
    if options.resident_layers is not None and options.offload == "none":
        raise SpecchatError("--resident-layers counts the layers an offloaded target keeps on the device: "
                            "use it with --offload auto, ram or disk")
    check_memory_budgets(options.ram_budget, options.vram_budget)
    if options.offload == "none" and (options.ram_budget is not None or options.vram_budget is not None):
        name = "--ram-budget" if options.ram_budget is not None else "--vram-budget"
        raise SpecchatError(f"{name} caps where offloaded layers go: use it with --offload auto, ram or disk")
    if options.offload_dir is not None and expanded(options.offload_dir, "--offload-dir").is_file():
        raise SpecchatError(f"--offload-dir {options.offload_dir} is a file, not a directory")
    if options.draft_quant not in DRAFT_QUANTS:
        raise SpecchatError(f"unknown draft quantization '{options.draft_quant}': choose one of {', '.join(DRAFT_QUANTS)}")
    if options.draft_vocab < 0:
        raise SpecchatError(f"--draft-vocab must be >= 0, 0 for the whole vocabulary (got {options.draft_vocab})")
    check_dsi_values(options)


def check_named_models(options: EngineOptions) -> None:
    """What the model specs the engine loads (the target, and the draft where it drafts) name on
    this machine, checked without torch (models/spec.py); one line for the first that cannot load."""
    specs = (options.target, options.draft) if options.engine in DRAFTED_ENGINES else (options.target,)
    check_models(specs, options.allow_pickle)


def check_dsi_values(options: EngineOptions) -> None:
    LOOKAHEAD.check("--lookahead", options.lookahead)
    if options.engine != "dsi":
        if options.ray_address is not None or options.workers is not None:
            raise SpecchatError("--workers and --ray-address are for --engine dsi")
        return
    if options.offload not in ("none", "auto"):  # auto: in memory, as dsi needs
        raise SpecchatError("--engine dsi keeps a target on every worker: use --offload none")
