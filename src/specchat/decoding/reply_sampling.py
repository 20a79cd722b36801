"""A reply's `SamplingParams` from the sampling settings every front end names alike: the command
line's options (cli_options.SamplingOptions), the chat's settings (tui/settings.py) and a served
request's fields over the server's defaults (serve/schema.py), each named as limits.SAMPLING_BOUNDS
names them."""

from collections.abc import Mapping
from typing import Any

from specchat.decoding.events import SamplingParams
from specchat.decoding.mirostat import mirostat_state

# The settings SamplingParams takes as they are (top-k and mirostat's three are mapped below).
AS_GIVEN = ("temperature", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold",
            "dynatemp_range", "dynatemp_exponent")


def reply_sampling(settings: Mapping[str, Any], seed: int) -> SamplingParams:
    """The sampling of one reply under `settings` (checked) and `seed`: top-k's -1 (vLLM's "keep
    all") as 0, and the reply's own mirostat state, made afresh."""
    return SamplingParams(seed=seed, top_k=max(settings["top_k"], 0),
                          mirostat=mirostat_state(settings["mirostat"], settings["mirostat_tau"],
                                                  settings["mirostat_eta"]),
                          **{name: settings[name] for name in AS_GIVEN})
