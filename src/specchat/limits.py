"""The ranges every front end accepts for the decoding settings, and their defaults: one home, so
`generate`, `run`, `bench` and the chat's slash commands agree on them."""

import random
from dataclasses import dataclass

from specchat.errors import ContextOverflow, SpecchatError


def written(bound: float) -> str:
    """A bound as a user types it: an integer whole (--context's 1048576, not :g's 1.04858e+06), a
    float shortest."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


@dataclass(frozen=True)
class Bounds:
    """The range [low, high], or (low, high] when `low_open`."""

    low: float
    high: float
    low_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def describe(self) -> str:
        low, high = written(self.low), written(self.high)
        return f"in ({low}, {high}]" if self.low_open else f"between {low} and {high}"

    def problem(self, name: str, value: float) -> str | None:
        """Why `value` is not acceptable for `name`, in one line; None when it is."""
        return None if value in self else f"{name} must be {self.describe()} (got {value})"

    def check(self, name: str, value: float) -> None:
        """Raise the one-line error for a value of the option `name` out of range."""
        problem = self.problem(name, value)
        if problem:
            raise SpecchatError(problem)


BUDGET = Bounds(1, 8192)  # draft tree size K
DEPTH = Bounds(1, 256)  # deepest draft tree node D
LOOKAHEAD = Bounds(1, 64)  # dsi: drafts per verification job
MAX_TOKENS = Bounds(1, 32768)  # new tokens per reply
TEMPERATURE = Bounds(0.0, 5.0)  # 0 = greedy
TOP_P = Bounds(0.0, 1.0, low_open=True)  # nucleus sampling mass
TOP_K = Bounds(-1, 2**31 - 1)  # the likeliest tokens kept; 0 and -1 (vLLM's "off") keep all
MIN_P = Bounds(0.0, 1.0)  # a token's least probability over the likeliest's; 0 cuts nothing
TYPICAL_P = Bounds(0.0, 1.0, low_open=True)  # the typical set's mass; 1 cuts nothing
TOP_N_SIGMA = Bounds(-1.0, 100.0)  # standard deviations below the top logit kept; <= 0 (llama.cpp's -1) cuts nothing
XTC_PROBABILITY = Bounds(0.0, 1.0)  # how often XTC drops the likeliest tokens; 0: never
XTC_THRESHOLD = Bounds(0.0, 1.0)  # the probability from which a token counts as a top choice; above 0.5 none can
DYNATEMP_RANGE = Bounds(0.0, 5.0)  # how far the dynamic temperature moves either way; 0: a fixed temperature
DYNATEMP_EXPONENT = Bounds(0.0, 100.0)  # the power of the normalized entropy that sets it
MIROSTAT = Bounds(0, 2)  # mirostat's version; 0: off
MIROSTAT_TAU = Bounds(0.0, 100.0)  # its target surprise, in bits a token
MIROSTAT_ETA = Bounds(0.0, 10.0)  # its learning rate
# The sampling every front end takes, by its field's name (the CLI's flags and the chat's commands
# are the names with dashes): one table for the command line's, the chat's and serve's checks.
SAMPLING_BOUNDS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "min_p": MIN_P,
                   "typical_p": TYPICAL_P, "top_n_sigma": TOP_N_SIGMA, "xtc_probability": XTC_PROBABILITY,
                   "xtc_threshold": XTC_THRESHOLD, "dynatemp_range": DYNATEMP_RANGE,
                   "dynatemp_exponent": DYNATEMP_EXPONENT, "mirostat": MIROSTAT, "mirostat_tau": MIROSTAT_TAU,
                   "mirostat_eta": MIROSTAT_ETA}
PRESENCE_OR_FREQUENCY = Bounds(-2.0, 2.0)  # OpenAI's presence_penalty and frequency_penalty
REPEAT_PENALTY = Bounds(0.0, 100.0, low_open=True)  # 1: off; a repeated token's logit divided or multiplied by it
REPEAT_LAST_N = Bounds(-1, 2**31 - 1)  # llama.cpp's window of counted tokens; -1: all, 0: none
DEFAULT_REPEAT_LAST_N = 64  # llama.cpp's and Ollama's repeat_last_n
DRY_MULTIPLIER = Bounds(0.0, 100.0)  # DRY's penalty at the allowed length; 0: off
DRY_BASE = Bounds(1.0, 100.0)  # how fast it grows with each token past it
DRY_ALLOWED_LENGTH = Bounds(0, 2**31 - 1)  # the longest repeat left unpenalized
DRY_PENALTY_LAST_N = Bounds(-1, 2**31 - 1)  # the tokens DRY looks back over; -1: all, 0: off
# DRY's settings by field name, as SAMPLING_BOUNDS (the CLI's flags and the chat's commands: the names with dashes)
DRY_BOUNDS = {"dry_multiplier": DRY_MULTIPLIER, "dry_base": DRY_BASE, "dry_allowed_length": DRY_ALLOWED_LENGTH,
              "dry_penalty_last_n": DRY_PENALTY_LAST_N}
# llama-cli's penalties and DRY by field name: one table for the command line's and the chat's checks
PENALTY_BOUNDS = {"repeat_penalty": REPEAT_PENALTY, "repeat_last_n": REPEAT_LAST_N,
                  "presence_penalty": PRESENCE_OR_FREQUENCY, "frequency_penalty": PRESENCE_OR_FREQUENCY, **DRY_BOUNDS}
LOGIT_BIAS = Bounds(-100.0, 100.0)  # OpenAI's: added to a token's logit
POOLINGS = ("mean", "last")  # how an embedding pools the target's rows (decoding/embedding.py)
DEFAULT_POOLING = "mean"
CONTEXT = Bounds(64, 2**20)  # --context: tokens of KV room (the model's own maximum is checked too)
SLOTS = Bounds(1, 256)  # serve's --slots (and doctor's, planning for it): conversations kept, each its KV caches
MEMORY_BUDGET_GB = Bounds(0.0, 1e6, low_open=True)  # --ram-budget and --vram-budget, in GB (1e9 bytes)

OFFLOAD_TIERS = ("auto", "none", "ram", "disk")
DEFAULT_OFFLOAD = "auto"  # layers placed in the fastest tier with room (specchat.plan.placement)

# The KV room a run plans for, unless --context says otherwise: what llama-server and ollama
# give a model by default, not a 128k model's maximum (Llama-3.1-70B: 42 GB of KV at 131072).
DEFAULT_CONTEXT = 4096
DEFAULT_TEMPERATURE = 0.6
DEFAULT_TOP_P = 0.9
DEFAULT_SEED = 0
SEED_LIMIT = 2**63  # seeds are below it: torch's generators (bench --compare-hf) take a signed 64-bit one


def fresh_seed() -> int:
    """A seed for a reply that names none where no default is fixed (the chat's /seed off, a served
    request): a new one each time, so that the same prompt sampled again gives another reply."""
    return random.randrange(2**31)
DEFAULT_MAX_DEPTH = 24
DEFAULT_LOOKAHEAD = 5
DEFAULT_DTYPE = "bfloat16"
DTYPE_NAMES = ("float32", "bfloat16")  # --dtype (dtypes.DTYPES: their torch dtypes)
# Tokens the draft's LM head scores; 0 = all. The FR-Spec sub-vocabulary of 32768 tokens ranked
# on chat replies and code reads 22% of the head's bytes and cost 3-5% of the gen rate on
# MT-Bench (ranked on code alone it cost 22%: docs/benchmarks.md, "Draft levers").
FR_SPEC_VOCAB = 32768
DEFAULT_DRAFT_VOCAB = FR_SPEC_VOCAB


def default_budget(cuda: bool, offloaded: bool) -> int:
    """The draft tree size K that pays on this device.

    In memory on a CPU the draft costs ~0.4x the target per step, so small trees pay best
    (docs/benchmarks.md); a GPU scores hundreds of tokens for the price of a few. Offloaded, a
    target pass costs the weights' transfer time whatever the tree size, so trees grow large;
    on a CPU drafting a tree of more than a few hundred tokens costs more than it gains.
    """
    if offloaded:
        return 1024 if cuda else 256
    return 256 if cuda else 16


def auto_cap(cuda: bool, offloaded: bool) -> int:
    """The largest tree --budget auto may choose: a bound on one target pass's size (and so its
    memory), well past where the measured costs stop a tree from growing."""
    if offloaded:
        return 2048 if cuda else 1024
    return 1024 if cuda else 128


SMALLEST_AUTO_TREE = 128  # the in-memory CPU cap; a memory plan shrinks auto's cap no further


def auto_trees(cap: int) -> tuple[int, ...]:
    """The largest passes (a tree and its root) a memory plan may give --budget auto under `cap`:
    the cap's, then halves down to SMALLEST_AUTO_TREE."""
    trees = [cap]
    while trees[-1] // 2 >= SMALLEST_AUTO_TREE:
        trees.append(trees[-1] // 2)
    return tuple(tree + 1 for tree in trees)


def reply_limit(prompt_tokens: int, max_new_tokens: int | None, context: int) -> int:
    """New tokens a reply may have after a prompt of `prompt_tokens` in the target's context:
    `max_new_tokens` (None: as many as the context holds), or less where the context ends. The one
    reckoning `generate`, the chat and the server share; a prompt that leaves no room is refused."""
    if prompt_tokens >= context:
        raise ContextOverflow(prompt_tokens, context)
    room = context - prompt_tokens
    return room if max_new_tokens is None else min(max_new_tokens, room)


def check_memory_budgets(ram_budget: float | None, vram_budget: float | None) -> None:
    """--ram-budget and --vram-budget in range where given: the one check a run and `doctor`,
    which both plan with them, make."""
    for name, value in (("--ram-budget", ram_budget), ("--vram-budget", vram_budget)):
        if value is not None:
            MEMORY_BUDGET_GB.check(name, value)


def check_text(name: str, text: str) -> None:
    """One line where `text` holds a lone surrogate, which no tokenizer takes: Python keeps an
    argument's (or a C locale's stdin's) bytes that are not UTF-8 so."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecchatError(f"{name} is not UTF-8 text (a lone surrogate, or bytes that are not UTF-8)") from None
