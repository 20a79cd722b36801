"""Two cuts llama.cpp samples with that transformers lacks, as llama.cpp's samplers compute them:
top-n-sigma (Tang et al. 2024, "Top-nσ: Not All Logits Are You Need") and XTC (Exclude Top
Choices, p-e-w 2024).

Top-n-sigma keeps a token t iff z_t >= max z - n sigma, with sigma the (population) standard
deviation of the finite logits: the informative tokens stand out of a roughly Gaussian noise
floor by several sigma. Dividing every logit by a temperature T divides max z and sigma alike, so
the kept set is the same before or after temperature (up to rounding): the chain applies it right
after temperature, where llama.cpp's applies it first, before top-k. n <= 0 cuts nothing
(llama.cpp's default is -1).

XTC, with probability `probability` at a position, removes every token whose probability is at
least `threshold` except the least likely of them, when there are two or more: the most
predictable continuations give way to the next likeliest. The chain applies it last, after
typical-p, on the distribution the earlier cuts left (llama.cpp: after min-p). Tied least likely
tokens all stay (llama.cpp's sort keeps one of them by its order).

Why speculation stays exact: both are functions of one position's logits, except XTC's coin,
which is the position's own keyed uniform (keyed.py, its own stream) where llama.cpp draws one
from its sampler's generator each token: whether XTC cuts at position n is a function of (seed,
n), as u_n is, so sampling.py's argument carries over unchanged.
"""

import math

import torch

from specchat.decoding.keyed import Purpose, derived_uniform


def cut_top_n_sigma(scores: torch.Tensor, n: float) -> torch.Tensor:
    """Scores [..., V] below the largest less n standard deviations of the finite ones cut to -inf
    (mean and deviation in float64, so a row's answer does not hang on its summation order)."""
    finite = torch.isfinite(scores)
    values = scores.double().masked_fill(~finite, 0.0)
    count = finite.sum(dim=-1, keepdim=True)
    mean = values.sum(dim=-1, keepdim=True) / count
    spread = ((values - mean).masked_fill(~finite, 0.0).square().sum(dim=-1, keepdim=True) / count).sqrt()
    floor = scores.double().amax(dim=-1, keepdim=True) - n * spread  # the largest is finite: a cut's -inf never is
    return scores.masked_fill(scores.double() < floor, -math.inf)


def cut_xtc(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Scores [..., V] of the tokens at least `threshold` likely cut to -inf, all but the least likely
    of them, in rows where two or more are; other rows as they were."""
    probs = torch.softmax(scores.double(), dim=-1)
    top = probs >= threshold
    # a row with one such token has it as its least, and a row with none an infinite least: nothing cut
    least = probs.masked_fill(~top, math.inf).amin(dim=-1, keepdim=True)
    return scores.masked_fill(top & (probs > least), -math.inf)


def xtc_cuts_at(seed: int, position: int, probability: float) -> bool:
    """Whether XTC's coin, the uniform keyed by (seed, position) on XTC's stream, falls below its
    probability there: 0 never, 1 always."""
    return probability > 0 and derived_uniform(seed, Purpose.XTC, 0, position) < probability
