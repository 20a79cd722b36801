"""The decoding settings a chat session can change live, and their one-line validation."""

from dataclasses import dataclass, replace
from typing import Any

from specchat.decoding.events import AUTO, SamplingParams
from specchat.decoding.reply_sampling import reply_sampling
from specchat.limits import (BUDGET, DEFAULT_LOOKAHEAD, DEFAULT_MAX_DEPTH, DEFAULT_REPEAT_LAST_N, DEFAULT_SEED,
                             DEFAULT_TEMPERATURE, DEFAULT_TOP_P, DEPTH, LOOKAHEAD, MAX_TOKENS, PENALTY_BOUNDS,
                             SAMPLING_BOUNDS, SEED_LIMIT, fresh_seed)

# The ranges of the numeric settings, the command line's own (specchat.limits).
LIMITS = {"budget": BUDGET, "depth": DEPTH, "lookahead": LOOKAHEAD, "max_tokens": MAX_TOKENS, **SAMPLING_BOUNDS,
          **PENALTY_BOUNDS}


@dataclass(frozen=True)
class DecodingSettings:
    budget: int | str = AUTO  # K, or AUTO (the engine sizes its trees)
    depth: int = DEFAULT_MAX_DEPTH
    lookahead: int = DEFAULT_LOOKAHEAD  # dsi's drafts per verification job, as `specchat run --lookahead`
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = 0  # the K likeliest tokens only (0: all)
    min_p: float = 0.0  # drop tokens below min_p x the likeliest's probability (0: none)
    typical_p: float = 1.0  # keep the locally typical tokens up to this mass (1: all)
    top_n_sigma: float = -1.0  # keep the tokens within n standard deviations of the top logit (<= 0: all)
    xtc_probability: float = 0.0  # how often XTC drops the likeliest tokens (0: never)
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0  # > 0: each token's temperature set by the entropy the cuts leave (0: fixed)
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 1 or 2: mirostat in place of the cuts (0: off)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # llama.cpp's penalties, each over the last repeat_last_n tokens of the conversation (1, 0 and 0: off)
    repeat_penalty: float = 1.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0  # llama.cpp's DRY over the last dry_penalty_last_n tokens (0: off)
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    seed: int | None = DEFAULT_SEED  # None: a fresh seed for every reply
    max_tokens: int = 1024
    engine: str = "specexec"
    system_prompt: str = ""
    # /json, /schema, /grammar: what replies keep to, a JSON schema or a grammar's text (GBNF or Lark); None: free text
    reply_form: dict | str | None = None

    def sampling(self) -> SamplingParams:
        return reply_sampling(vars(self), self.seed if self.seed is not None else fresh_seed())

    def with_value(self, field: str, value: Any) -> "DecodingSettings":
        """A copy with `field` set; raises ValueError with a one-line message if invalid."""
        error = problem(field, value)
        if error:
            raise ValueError(error)
        return replace(self, **{field: value})


def problem(field: str, value: Any) -> str | None:
    """Why `value` is not acceptable for `field`, in one line; None when it is."""
    if field == "budget" and value == AUTO:
        return None
    if field in LIMITS:
        return LIMITS[field].problem(field.replace("_", "-"), value)
    if field == "seed" and value is not None and not 0 <= value < SEED_LIMIT:
        return f"seed must be >= 0 and below 2**63, or 'off' (got {value})"
    return None
