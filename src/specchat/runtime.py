"""Building a ready-to-run engine from user-facing options (shared by the CLI and, later, the TUI)."""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import ChainSDEngine
from specchat.decoding.drafter import TreeShape
from specchat.decoding.events import Engine
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SpecExecEngine
from specchat.decoding.specinfer import SpecInferEngine
from specchat.decoding.stopping import stop_token_ids
from specchat.errors import SpecchatError
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.loading import LoadedModel, load, load_offloaded, resolve
from specchat.models.nf4 import draft_quantization
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.offload.runner import Offload, OffloadPlan
from specchat.paths import cache_dir
from specchat.progress import Report, Reporter

ENGINES = ("autoregressive", "specexec", "sd", "specinfer")
DRAFTED_ENGINES = ("specexec", "sd", "specinfer")  # engines that need a draft model
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
OFFLOAD_TIERS = ("none", "ram", "disk")
DRAFT_QUANTS = ("none", "nf4")


@dataclass(frozen=True)
class EngineOptions:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    engine: str = "specexec"
    budget: int | None = None  # None: suited to the device
    max_depth: int = 24
    dtype: str = "bfloat16"
    offload: str = "none"  # where the target's decoder layers live: none (on the device), ram, disk
    offload_dir: str | None = None  # the disk tier's layer file; None: the user cache dir
    resident_layers: int | None = None  # layers kept on the device when offloading; None: what fits
    draft_quant: str = "none"  # nf4: the draft in 4-bit through bitsandbytes (CUDA only)


@dataclass
class Runtime:
    engine: Engine
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    offload: Offload | None = None

    def close(self) -> None:
        """Stop the weight streamer's loader thread and close the layer file."""
        if self.offload is not None:
            self.offload.close()


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_budget(device: torch.device, offloaded: bool) -> int:
    """In memory on a CPU the draft costs ~0.4x the target per step, so small trees pay best
    (docs/benchmarks.md); a GPU scores hundreds of tokens for the price of a few. Offloaded, a
    target pass costs the weights' transfer time whatever the tree size, so trees grow large;
    on a CPU drafting a tree of more than a few hundred tokens costs more than it gains."""
    if offloaded:
        return 1024 if device.type == "cuda" else 256
    return 256 if device.type == "cuda" else 16


def validate(options: EngineOptions) -> None:
    """Check what can be checked before loading anything; one clear line on failure."""
    if options.engine not in ENGINES:
        raise SpecchatError(f"unknown engine '{options.engine}': choose one of {', '.join(ENGINES)}")
    if options.dtype not in DTYPES:
        raise SpecchatError(f"unknown dtype '{options.dtype}': choose one of {', '.join(DTYPES)}")
    if options.budget is not None and not 1 <= options.budget <= 8192:
        raise SpecchatError(f"--budget must be between 1 and 8192 (got {options.budget})")
    if not 1 <= options.max_depth <= 256:
        raise SpecchatError(f"--max-depth must be between 1 and 256 (got {options.max_depth})")
    if options.offload not in OFFLOAD_TIERS:
        raise SpecchatError(f"unknown offload tier '{options.offload}': choose one of {', '.join(OFFLOAD_TIERS)}")
    if options.resident_layers is not None and options.resident_layers < 0:
        raise SpecchatError(f"--resident-layers must be >= 0 (got {options.resident_layers})")
    if options.offload_dir is not None and Path(options.offload_dir).expanduser().is_file():
        raise SpecchatError(f"--offload-dir {options.offload_dir} is a file, not a directory")
    if options.draft_quant not in DRAFT_QUANTS:
        raise SpecchatError(f"unknown draft quantization '{options.draft_quant}': choose one of {', '.join(DRAFT_QUANTS)}")
    resolve(options.target)
    if options.engine in DRAFTED_ENGINES:
        resolve(options.draft)


def build_runtime(options: EngineOptions, progress: bool = True, report: Report | None = None) -> Runtime:
    """Load the models named by `options` and wire the chosen engine.

    `progress` draws bars on stderr; `report`, if given, also receives every step and fraction.
    """
    validate(options)
    reporter = Reporter(progress, report)
    device = pick_device()
    dtype = DTYPES[options.dtype]
    quantization = draft_quantization(options.draft_quant, device, dtype) if options.engine in DRAFTED_ENGINES else None
    target, offload = load_target(options, device, dtype, reporter)
    stops = stop_token_ids(target.model, target.tokenizer)
    target_lm, draft_lm = CausalLM(target.model, offload), None
    if options.engine in DRAFTED_ENGINES:
        draft = load(options.draft, dtype, progress, report, quantization=quantization, device=device)
        check_tokenizers_compatible(draft.tokenizer, target.tokenizer)
        if quantization is None:
            reporter.step(f"moving {draft.name} to {device.type}")
            draft.model.to(device)
        draft_lm = CausalLM(draft.model)
    budget = options.budget if options.budget is not None else default_budget(device, offload is not None)
    engine = make_engine(options.engine, target_lm, draft_lm, stops, TreeShape(budget=budget, max_depth=options.max_depth))
    reporter.step("ready", 1.0)
    return Runtime(engine=engine, tokenizer=target.tokenizer, device=device, offload=offload)


def make_engine(name: str, target: CausalLM, draft: CausalLM | None, stop_ids: frozenset[int],
                shape: TreeShape) -> Engine:
    """The engine `name` over already loaded models (`draft` is None for autoregressive)."""
    if name == "autoregressive":
        return AutoregressiveEngine(target, stop_ids)
    if name == "specexec":
        return SpecExecEngine(target, draft, stop_ids, shape)
    if name == "sd":
        return ChainSDEngine(target, draft, stop_ids, shape)
    if name == "specinfer":
        return SpecInferEngine(target, draft, stop_ids, shape)
    raise SpecchatError(f"unknown engine '{name}': choose one of {', '.join(ENGINES)}")


def load_target(options: EngineOptions, device: torch.device, dtype: torch.dtype,
                reporter: Reporter) -> tuple[LoadedModel, Offload | None]:
    """The target in device memory, or with its decoder layers streamed from RAM or disk."""
    if options.offload == "none":
        target = load(options.target, dtype, reporter.bars, reporter.report)
        reporter.step(f"moving {target.name} to {device.type}")
        target.model.to(device)
        return target, None
    plan = OffloadPlan(
        tier=options.offload,
        offload_dir=Path(options.offload_dir).expanduser() if options.offload_dir else cache_dir() / "offload",
        resident_layers=options.resident_layers,
    )
    return load_offloaded(options.target, dtype, device, plan, reporter)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, raw: bool) -> list[int]:
    """Token ids of a single-turn chat (the model's chat template), or of `prompt` as is."""
    if raw or tokenizer.chat_template is None:
        ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    else:
        messages = [{"role": "user", "content": prompt}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = list(encoded["input_ids"])
    if not ids:
        raise SpecchatError("the prompt is empty after tokenization: give some text")
    return ids
