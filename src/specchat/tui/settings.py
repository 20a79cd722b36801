"""The decoding settings a chat session can change live, and their one-line validation."""

import random
from dataclasses import dataclass, replace
from typing import Any

from specchat.decoding.events import SamplingParams

# Inclusive integer ranges, shared with the `generate` command's own checks.
INT_LIMITS = {"budget": (1, 8192), "depth": (1, 256), "lookahead": (1, 64), "max_tokens": (1, 32768)}


@dataclass(frozen=True)
class DecodingSettings:
    budget: int = 16
    depth: int = 24
    lookahead: int = 5  # dsi's drafts per verification job, as `specchat run --lookahead`
    temperature: float = 0.6
    top_p: float = 0.9
    seed: int | None = 0  # None: a fresh seed for every reply
    max_tokens: int = 1024
    engine: str = "specexec"
    system_prompt: str = ""

    def sampling(self) -> SamplingParams:
        seed = self.seed if self.seed is not None else random.randrange(2**31)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=seed)

    def with_value(self, field: str, value: Any) -> "DecodingSettings":
        """A copy with `field` set; raises ValueError with a one-line message if invalid."""
        error = problem(field, value)
        if error:
            raise ValueError(error)
        return replace(self, **{field: value})


def problem(field: str, value: Any) -> str | None:
    """Why `value` is not acceptable for `field`, in one line; None when it is."""
    if field in INT_LIMITS:
        low, high = INT_LIMITS[field]
        if not low <= value <= high:
            return f"{field.replace('_', '-')} must be between {low} and {high} (got {value})"
    elif field == "temperature" and not 0.0 <= value <= 5.0:
        return f"temperature must be between 0 and 5 (got {value})"
    elif field == "top_p" and not 0.0 < value <= 1.0:
        return f"top-p must be in (0, 1] (got {value})"
    elif field == "seed" and value is not None and value < 0:
        return f"seed must be >= 0 or 'off' (got {value})"
    return None
