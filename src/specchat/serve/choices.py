"""Several choices for one request (OpenAI's `n`, on its chat and text completions): how many, and
each one's seed; and on text completions `best_of` candidates a prompt, of which the `n` likeliest
are returned. The choices of a request are decoded one after another, each queued as a request of
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


def candidate_count(best_of: int | None, n: int) -> int:
    """The candidates decoded a prompt (OpenAI's `best_of`): `n` where it is left out; a 400 below
    `n` (nothing to return the rest from) or above MAX_CHOICES."""
    if best_of is None:
        return n
    if not n <= best_of <= MAX_CHOICES:
        raise bad_request(f"best_of must be between n ({n}) and {MAX_CHOICES} (got {best_of})", "invalid_value",
                          "best_of")
    return best_of


def best_indices(scores: list[float], n: int) -> list[int]:
    """The indices of the `n` highest scores, highest first; of equal scores the earlier (its seed
    the lower) first, so that the choice repeats with the seed."""
    return sorted(range(len(scores)), key=lambda index: -scores[index])[:n]


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s sampling: the request's seed (or the one drawn for it) plus `index`, so that
    the choices of a seeded request differ and each repeats exactly as a request of its own with the
    seed its `specchat` figures give."""
    return replace(sampling, seed=(sampling.seed + index) % SEED_LIMIT)
