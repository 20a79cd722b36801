"""The commands' shared options, declared once: `with_engine_options` gives `generate`, `run` and
`serve` every `EngineOptions` field as an option and hands them the checked `EngineOptions`
(`bench` and `doctor` take single declarations, with their own defaults); `with_sampling_options`
gives the three the sampling cuts as `SamplingOptions`, and `with_penalty_options` llama-cli's
penalties as `PenaltyOptions`. Each decorator puts its options where the command names its
parameter, and hands that parameter the options checked."""

import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer

from specchat.errors import SpecchatError
from specchat.limits import (DEFAULT_REPEAT_LAST_N, DEFAULT_TEMPERATURE, DEFAULT_TOP_P, PENALTY_BOUNDS, SAMPLING_BOUNDS,
                             SEED_LIMIT, SLOTS, Bounds)
from specchat.engine_options import AUTO, ENGINES, EngineOptions, SamplingParams, check_named_models, check_values

TargetOpt = Annotated[str, typer.Option(help="Target model: alias, hub id, directory or .gguf.")]
DraftOpt = Annotated[str, typer.Option(help="Draft model: alias, hub id, directory or .gguf.")]
BudgetOpt = Annotated[str | None, typer.Option(
    help="Draft tree size K, or auto: sized every iteration from the tree's predicted acceptance and "
         "measured costs (specexec) (default: suited to the device).")]
TemperatureOpt = Annotated[float, typer.Option(help="0 = greedy.")]
TopPOpt = Annotated[float, typer.Option(help="Nucleus sampling mass, as HF's top_p.")]
TopKOpt = Annotated[int, typer.Option(help="Sample among the K likeliest tokens only, as HF's top_k (0: all).")]
MinPOpt = Annotated[float, typer.Option(
    help="Drop tokens less likely than this fraction of the likeliest, as HF's min_p (0: none).")]
TypicalPOpt = Annotated[float, typer.Option(
    help="Keep the tokens whose surprise lies nearest the distribution's entropy, up to this mass, as HF's "
         "typical_p (1: all).")]
TopNSigmaOpt = Annotated[float, typer.Option(
    help="Keep the tokens whose logit lies within this many standard deviations of the likeliest's, as llama.cpp's "
         "top_n_sigma (<= 0: all).")]
XtcProbabilityOpt = Annotated[float, typer.Option(
    help="How often XTC drops the tokens at least --xtc-threshold likely but the least of them, as llama.cpp's "
         "(0: never).")]
XtcThresholdOpt = Annotated[float, typer.Option(help="The probability from which XTC counts a token as a top choice.")]
DynatempRangeOpt = Annotated[float, typer.Option(
    help="Dynamic temperature, as llama.cpp's: each token's temperature in [temperature - R, temperature + R], set by "
         "the entropy of what the cuts leave, which then run before it (0: a fixed temperature).")]
DynatempExponentOpt = Annotated[float, typer.Option(
    help="How the normalized entropy maps onto that range: its power, as llama-cli's --dynatemp-exp.")]
MirostatOpt = Annotated[int, typer.Option(
    help="Sample by mirostat 1 or 2, as llama.cpp's, holding each token's surprise near --mirostat-tau in place of "
         "the cuts above (0: off).")]
MirostatTauOpt = Annotated[float, typer.Option(help="Mirostat's target surprise in bits, as llama-cli's "
                                               "--mirostat-ent.")]
MirostatEtaOpt = Annotated[float, typer.Option(help="Mirostat's learning rate, as llama-cli's --mirostat-lr.")]
RepeatPenaltyOpt = Annotated[float, typer.Option(
    help="Discourage tokens among the last --repeat-last-n: a positive logit divided by this, a negative one "
         "multiplied, as llama.cpp's (1: off).")]
RepeatLastNOpt = Annotated[int, typer.Option(help="Tokens of the prompt and the reply the penalties count "
                                             "(-1: all).")]
PresencePenaltyOpt = Annotated[float, typer.Option(
    help="Subtracted from the logit of each token among the last --repeat-last-n, as llama.cpp's (0: off).")]
FrequencyPenaltyOpt = Annotated[float, typer.Option(
    help="Subtracted from a token's logit once per time it is among the last --repeat-last-n (0: off).")]
DryMultiplierOpt = Annotated[float, typer.Option(
    help="DRY, as llama.cpp's: a token that would extend a repeat of the context loses this x --dry-base to the "
         "power of the repeat's length past --dry-allowed-length (0: off).")]
DryBaseOpt = Annotated[float, typer.Option(help="How fast DRY's penalty grows with each repeated token.")]
DryAllowedLengthOpt = Annotated[int, typer.Option(help="The longest repeat DRY leaves unpenalized.")]
DryPenaltyLastNOpt = Annotated[int, typer.Option(help="Tokens of the prompt and the reply DRY looks back over "
                                                 "(-1: all).")]
DtypeOpt = Annotated[str, typer.Option(help="float32 | bfloat16")]
WeightsOpt = Annotated[str, typer.Option(
    help="The target's weights: quantized (multiplied in the 4 bits it stores, by torch's int4 kernels), dense "
         "(expanded to --dtype at load), or auto (quantized where the target stores 4-bit weights, except in float32).")]
OffloadOpt = Annotated[str, typer.Option(
    help="Where the target's decoder layers live: auto (each in the fastest tier with room: the device, pinned RAM "
         "beside a GPU, then the disk; those on the device spread among the streamed ones), none (on the device), "
         "ram, or disk (streamed per pass).")]
RamBudgetOpt = Annotated[float | None, typer.Option(
    help="GB of RAM specchat may take (on a CPU: the target's resident layers, the streaming ring, both KV caches, "
         "the largest pass and the draft; beside a GPU: the pinned layers and staging); default: what the process "
         "may take (cgroup limits included) less 1 GB for the OS.")]
VramBudgetOpt = Annotated[float | None, typer.Option(
    help="GB of GPU memory specchat may take (the target's layers, the draft, both KV caches and CUDA's "
         "margin); default: what is free. GPU only: on a CPU, --ram-budget.")]
OffloadDirOpt = Annotated[str | None, typer.Option(
    help="Directory of the disk tier's layer file (default: the user cache dir).")]
ResidentOpt = Annotated[int | None, typer.Option(
    help="Decoder layers kept on the device when offloading (default: as many as the budget allows).")]
DraftQuantOpt = Annotated[str, typer.Option(
    help="auto | none | int8 | int4 | nf4 | dense | fp8: the draft's weights (auto: int8 on a CPU where it pays; on "
         "a GPU full weights, int4, nf4 or fp8 (a draft stored in 4 bits: packed, dense or fp8), whichever gives the "
         "fastest predicted iteration, or streams the fewest bytes where its steps are unmeasured; int4: rounded to 4 "
         "bits, run packed; nf4: bitsandbytes, CUDA only; dense: a GPTQ or AWQ draft's weights expanded to --dtype; "
         "fp8: its linears in 8-bit floats, on GPUs of compute capability 8.9 up).")]
ContextOpt = Annotated[int | None, typer.Option(
    help="Tokens of context (prompt and reply) the KV caches are planned for (default: 4096, or the model's maximum "
         "when smaller; auto may halve it down to 1024 when the pair does not fit).")]
DraftVocabOpt = Annotated[int, typer.Option(
    help="Tokens the draft's LM head scores, the most frequent first (0: the whole vocabulary).")]
AllowPickleOpt = Annotated[bool, typer.Option(
    "--allow-pickle", help="Load local checkpoints whose weights are pickles (.bin, .pt): only from a source you trust.")]
LookaheadOpt = Annotated[int, typer.Option(help="dsi: drafts k per verification job.")]
WorkersOpt = Annotated[str | None, typer.Option(
    help="dsi: the target workers' devices, e.g. cpu,cpu or cuda:0,cuda:1 (default: two on this machine's device).")]
RayOpt = Annotated[str | None, typer.Option(
    help="dsi: run the target workers as actors of this Ray cluster (auto or HOST:PORT; needs specchat[ray]).")]
RankedTreeOpt = Annotated[bool, typer.Option(
    hidden=True, help="Measurement: grow every tree by rank to its budget and depth, whatever the draft predicts.")]

# Every EngineOptions field as an option, in the field's order (a test holds the two together);
# the defaults are the fields' own.
ENGINE_OPTIONS: dict[str, Any] = {
    "target": TargetOpt, "draft": DraftOpt,
    "engine": Annotated[str, typer.Option(help=" | ".join(ENGINES))],
    "budget": BudgetOpt,
    "max_depth": Annotated[int, typer.Option(help="Deepest draft tree node D.")],
    "dtype": DtypeOpt, "weights": WeightsOpt, "offload": OffloadOpt, "offload_dir": OffloadDirOpt,
    "resident_layers": ResidentOpt, "ram_budget": RamBudgetOpt, "vram_budget": VramBudgetOpt, "context": ContextOpt,
    "draft_quant": DraftQuantOpt, "draft_vocab": DraftVocabOpt, "lookahead": LookaheadOpt, "workers": WorkersOpt,
    "ray_address": RayOpt, "allow_pickle": AllowPickleOpt, "ranked_tree": RankedTreeOpt,
}

Command = Callable[..., None]
Options = TypeVar("Options")  # a dataclass of options


def with_engine_options(engine_help: str | None = None,
                        leave_out: tuple[str, ...] = ()) -> Callable[[Command], Command]:
    """Make a command that takes `options: EngineOptions` offer ENGINE_OPTIONS in its place (but
    those in `leave_out`, which keep their defaults; `engine_help`: --engine's own help) and receive
    them as `engine_options` builds and checks them."""
    declared = dict(ENGINE_OPTIONS)
    if engine_help is not None:
        declared["engine"] = Annotated[str, typer.Option(help=engine_help)]
    shared = options_of(EngineOptions, {name: declared[name] for name in declared if name not in leave_out})
    return lambda command: spliced(command, "options", shared, engine_options)


def options_of(kind: type, declared: dict[str, Any]) -> list[inspect.Parameter]:
    """The `declared` fields of the dataclass `kind` as keyword options, with the fields' defaults."""
    defaults = {field.name: field.default for field in fields(kind)}
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=defaults[name])
            for name, annotation in declared.items()]


def spliced(command: Command, name: str, shared: list[inspect.Parameter],
            build: Callable[[dict[str, Any]], Any]) -> Command:
    """`command` offering the `shared` options where it declares its parameter `name` (so --help
    lists them there), which receives `build` of their values. Typer reads the signature made here."""
    own = list(inspect.signature(command).parameters.values())
    at = [parameter.name for parameter in own].index(name)
    shared = [parameter.replace(kind=own[at].kind) for parameter in shared]

    @wraps(command)
    def with_options(**values: Any) -> None:
        built = build({parameter.name: values.pop(parameter.name) for parameter in shared})
        command(**values, **{name: built})

    with_options.__signature__ = inspect.Signature([*own[:at], *shared, *own[at + 1:]])
    return with_options


def engine_options(values: dict[str, Any]) -> EngineOptions:
    """The command line's engine options as EngineOptions (--budget parsed), checked before
    anything loads or starts: one line on a bad value."""
    options = EngineOptions(**{**values, "budget": parse_budget(values.get("budget"))})
    check_values(options)  # before torch loads: a mistyped value answers at once,
    check_named_models(options)  # as does a model that cannot load here (offline, not cached)
    from specchat.runtime import validate  # what the values name on this machine, torch and the engines loaded

    validate(options)
    return options


def parse_budget(text: str | None) -> int | str | None:
    """--budget: a tree size, `auto`, or None (the device's default)."""
    if text is None or text == AUTO:
        return text
    try:
        return int(text)
    except ValueError:
        raise SpecchatError(f"--budget takes a tree size or 'auto' (got '{text}')") from None


def parse_slots(text: str) -> int | None:
    """--slots (serve's, and doctor's planning for it): a number of conversations, or auto (None)."""
    if text == AUTO:
        return None
    try:
        slots = int(text)
    except ValueError:
        raise SpecchatError(f"--slots takes a number of conversations or 'auto' (got '{text}')") from None
    SLOTS.check("--slots", slots)
    return slots


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling `generate`, `run` and `serve` take alike (torch-free; the seed is each one's own);
    the names are DecodingSettings' and serve's Defaults' own (so `run` and `serve` pass them by name)."""

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = 0
    min_p: float = 0.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1

    def params(self, seed: int) -> SamplingParams:
        """As an engine takes them (decoding/reply_sampling.py), with `seed` checked (torch loads here,
        as the command runs)."""
        check_seed(seed)
        from specchat.runtime import reply_sampling

        return reply_sampling(vars(self), seed)


SAMPLING_OPTIONS: dict[str, Any] = {"temperature": TemperatureOpt, "top_p": TopPOpt, "top_k": TopKOpt,
                                    "min_p": MinPOpt, "typical_p": TypicalPOpt, "top_n_sigma": TopNSigmaOpt,
                                    "xtc_probability": XtcProbabilityOpt, "xtc_threshold": XtcThresholdOpt,
                                    "dynatemp_range": DynatempRangeOpt, "dynatemp_exponent": DynatempExponentOpt,
                                    "mirostat": MirostatOpt,
                                    "mirostat_tau": MirostatTauOpt, "mirostat_eta": MirostatEtaOpt}


def with_sampling_options(command: Command) -> Command:
    """Make a command that takes `sampling: SamplingOptions` offer SAMPLING_OPTIONS in its place."""
    shared = options_of(SamplingOptions, SAMPLING_OPTIONS)
    return spliced(command, "sampling", shared, lambda values: checked_sampling(SamplingOptions(**values)))


def check_seed(seed: int) -> None:
    if not 0 <= seed < SEED_LIMIT:
        raise SpecchatError(f"--seed must be >= 0 and below 2**63 (got {seed})")


def checked_sampling(sampling: SamplingOptions) -> SamplingOptions:
    """`sampling`, or one line on a value out of range."""
    return checked_against(sampling, SAMPLING_BOUNDS)


def checked_against(options: Options, table: dict[str, Bounds]) -> Options:
    """`options`, or one line on the first field out of its bounds in `table` (the option: the field
    with dashes)."""
    for field, bounds in table.items():
        bounds.check("--" + field.replace("_", "-"), getattr(options, field))
    return options


@dataclass(frozen=True)
class PenaltyOptions:
    """llama-cli's penalties, as `generate` and `run` take them (torch-free: decoding/penalties.py
    builds them once a command runs); the names are DecodingSettings' own."""

    repeat_penalty: float = 1.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1


PENALTY_OPTIONS: dict[str, Any] = {"repeat_penalty": RepeatPenaltyOpt, "repeat_last_n": RepeatLastNOpt,
                                   "presence_penalty": PresencePenaltyOpt, "frequency_penalty": FrequencyPenaltyOpt,
                                   "dry_multiplier": DryMultiplierOpt, "dry_base": DryBaseOpt,
                                   "dry_allowed_length": DryAllowedLengthOpt, "dry_penalty_last_n": DryPenaltyLastNOpt}


def with_penalty_options(command: Command) -> Command:
    """Make a command that takes `penalties: PenaltyOptions` offer PENALTY_OPTIONS in its place."""
    shared = options_of(PenaltyOptions, PENALTY_OPTIONS)
    return spliced(command, "penalties", shared, lambda values: checked_penalties(PenaltyOptions(**values)))


def checked_penalties(penalties: PenaltyOptions) -> PenaltyOptions:
    """`penalties`, or one line on a value out of range."""
    return checked_against(penalties, PENALTY_BOUNDS)
