"""Building a ready-to-run engine from user-facing options (shared by the CLI and, later, the TUI)."""

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.drafter import TreeShape
from specchat.decoding.events import Engine
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SpecExecEngine
from specchat.decoding.stopping import stop_token_ids
from specchat.errors import SpecchatError
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.loading import load, resolve
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.progress import Report, Reporter

ENGINES = ("autoregressive", "specexec")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineOptions:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    engine: str = "specexec"
    budget: int | None = None  # None: suited to the device
    max_depth: int = 24
    dtype: str = "bfloat16"


@dataclass
class Runtime:
    engine: Engine
    tokenizer: PreTrainedTokenizerBase
    device: torch.device


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_budget(device: torch.device) -> int:
    """In memory on a CPU the draft costs ~0.4x the target per step, so small trees pay best
    (docs/benchmarks.md); a GPU scores hundreds of tokens for the price of a few."""
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
    resolve(options.target)
    if options.engine == "specexec":
        resolve(options.draft)


def build_runtime(options: EngineOptions, progress: bool = True, report: Report | None = None) -> Runtime:
    """Load the models named by `options` and wire the chosen engine.

    `progress` draws bars on stderr; `report`, if given, also receives every step and fraction.
    """
    validate(options)
    reporter = Reporter(progress, report)
    device = pick_device()
    dtype = DTYPES[options.dtype]
    target = load(options.target, dtype, progress, report)
    reporter.step(f"moving {target.name} to {device.type}")
    target.model.to(device)
    stops = stop_token_ids(target.model, target.tokenizer)
    if options.engine == "autoregressive":
        engine: Engine = AutoregressiveEngine(CausalLM(target.model), stops)
    else:
        draft = load(options.draft, dtype, progress, report)
        check_tokenizers_compatible(draft.tokenizer, target.tokenizer)
        reporter.step(f"moving {draft.name} to {device.type}")
        draft.model.to(device)
        budget = options.budget if options.budget is not None else default_budget(device)
        shape = TreeShape(budget=budget, max_depth=options.max_depth)
        engine = SpecExecEngine(CausalLM(target.model), CausalLM(draft.model), stops, shape)
    reporter.step("ready", 1.0)
    return Runtime(engine=engine, tokenizer=target.tokenizer, device=device)


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
