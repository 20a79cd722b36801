"""Several choices for one request (OpenAI's `n`, on its chat and text completions): how many, and
each one's seed. The choices of a request are decoded one after another, each queued as a request of
its own, so that they share the prompt's cache and other requests interleave with them fairly."""

from dataclasses import replace

from specchat.decoding.events import SamplingParams
from specchat.limits import SEED_LIMIT
from specchat.serve.errors import bad_request

MAX_CHOICES = 128  # as OpenAI's API


def choice_count(n: int | None) -> int:
    """The choices a request asks for: `n`, one where it is left out; a 400 outside [1, MAX_CHOICES]."""
    if n is None:
        return 1
    if not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"n must be between 1 and {MAX_CHOICES} (got {n})", "invalid_value", "n")
    return n


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s sampling: the request's seed (or the one drawn for it) plus `index`, so that
    the choices of a seeded request differ and each repeats exactly as a request of its own with the
    seed its `specchat` figures give."""
    return replace(sampling, seed=(sampling.seed + index) % SEED_LIMIT)
