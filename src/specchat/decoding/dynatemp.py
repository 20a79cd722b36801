"""llama.cpp's dynamic temperature ("dynatemp", kalomaze 2023), as its temp_ext sampler computes it.

Where the cuts have left n >= 2 candidates with probabilities p (a softmax of their logits), the
entropy H = -sum p log p over its largest value log n gives h in [0, 1], and the temperature is

    T_dyn = T_low + (T_high - T_low) h^exponent,  T_low = max(0, T - range), T_high = T + range:

a confident row (low entropy) is sampled cooler, an uncertain one hotter. As in llama.cpp the
temperature comes last: the cuts run on the untempered logits (sampling.py), then T_dyn divides
them. Where T_dyn is 0 (T_low clipped at 0, and one token holding all the probability) the
likeliest token alone stays, as llama.cpp's temperature 0 keeps it. The entropy is taken in
float64, so a row's answer does not hang on summation order.

Why speculation stays exact: T_dyn is a function of one position's logits, so the filtered
distribution p_n is still a function of the prefix, and sampling.py's argument carries over.
"""

import math

import torch


def dynamic_temperature(scores: torch.Tensor, temperature: float, spread: float, exponent: float) -> torch.Tensor:
    """T_dyn of each row of `scores` [..., V] (cut tokens at -inf), shaped [..., 1]; a row of one
    candidate keeps `temperature` (its distribution is one token whatever divides it)."""
    finite = torch.isfinite(scores)
    count = finite.sum(dim=-1, keepdim=True)
    logp = torch.log_softmax(scores.double(), dim=-1)
    entropy = -(logp.exp() * logp).masked_fill(~finite, 0.0).sum(dim=-1, keepdim=True)
    normalized = (entropy / count.double().clamp(min=2).log()).clamp(0.0, 1.0)
    low, high = max(0.0, temperature - spread), temperature + spread
    dynamic = low + (high - low) * normalized.pow(exponent)
    return torch.where(count > 1, dynamic, torch.full_like(dynamic, temperature))


def dynatemp_probs(scores: torch.Tensor, temperature: float, spread: float, exponent: float) -> torch.Tensor:
    """Float64 probabilities [..., V] of the cut `scores` divided by their rows' T_dyn; a row whose
    T_dyn is 0 is the one-hot of its likeliest token (made only for such rows: a vocabulary-wide
    one-hot a token would be a copy on the decoding path for a case that seldom comes)."""
    heat = dynamic_temperature(scores, temperature, spread, exponent)
    probs = (scores.double() / heat.clamp(min=math.ulp(0.0))).softmax(dim=-1)
    cold = heat[..., 0] <= 0
    if cold.any():
        probs[cold] = torch.nn.functional.one_hot(scores[cold].argmax(dim=-1), scores.shape[-1]).double()
    return probs
