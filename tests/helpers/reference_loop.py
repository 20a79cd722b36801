"""An independent reference for seeded (and greedy) decoding, written apart from the engines.

Every engine's claim "a seed gives exactly sequential sampling's tokens" was checked against the
project's own autoregressive engine, which shares `sample_token`, the filters and the KV caches
with the engines it judges. This loop shares none of that: transformers' forward (on the whole
prefix each step, or with transformers' own `DynamicCache`), transformers' own
`TemperatureLogitsWarper` and `TopPLogitsWarper`, and an inverse CDF written here.

The one thing taken from the project is `uniform(seed, n)`, the counter-based draw for the token
at absolute position n: its definition *is* the contract (docs/exactness.md: the number for
position n is keyed by (seed, n)), so there is nothing independent to write in its place.

`assert_transformers_tokens` judges an engine's reply against transformers' own reply on a model of
the same weights: greedy `generate(do_sample=False)`, seeded this loop.
"""

import math
from collections.abc import Callable, Collection

import torch
from helpers.exactness import hf_greedy
from transformers import DynamicCache, PreTrainedModel, TemperatureLogitsWarper, TopPLogitsWarper

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM  # hf_greedy's holder of the model: no forward of its own runs
from specchat.decoding.sampling import uniform  # the contract itself: see the module docstring

NO_INPUT = torch.zeros(1, 1, dtype=torch.long)  # the warpers read no input ids


def warped(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """transformers' warpers as `generate(do_sample=True)` chains them: temperature, then top-p
    when top_p < 1. logits [V] -> scores [V] (cut tokens at -inf)."""
    scores = TemperatureLogitsWarper(temperature)(NO_INPUT, logits.view(1, -1))
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(NO_INPUT, scores)
    return scores[0]


def inverse_cdf(scores: torch.Tensor, u: float) -> int:
    """The token whose interval of the cumulative distribution, summed in token-id order, holds
    u: the first id i with (p_0 + ... + p_i) > u * (p_0 + ... + p_(V-1)), in float64."""
    scores = scores.double()
    weights = torch.exp(scores - scores.max())  # unnormalised probabilities; exp(-inf) = 0
    cumulative = torch.cumsum(weights, dim=0)
    target = torch.tensor([u * float(cumulative[-1])], dtype=torch.float64)
    # right=True: the first index whose cumulative sum is strictly greater than the target
    return int(torch.searchsorted(cumulative, target, right=True)[0])


def choose(logits: torch.Tensor, temperature: float, top_p: float, seed: int, position: int) -> int:
    """The token at absolute `position`: the first maximum when greedy, else the inverse CDF of
    the warped distribution at the draw u = uniform(seed, position)."""
    if temperature == 0:
        return int(torch.argmax(logits))
    return inverse_cdf(warped(logits, temperature, top_p), uniform(seed, position))


@torch.inference_mode()
def reference_decode(model: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                     top_p: float, seed: int, stop_ids: Collection[int] = (), use_cache: bool = False,
                     allowed: Callable[[list[int]], torch.Tensor] | None = None) -> list[int]:
    """Decode `max_new_tokens` after `prompt_ids` (ending after a stop token) with a plain
    transformers causal LM. Without `use_cache` every step runs the whole prefix
    (`model(ids).logits[0, -1]`); with it, transformers' own `DynamicCache` holds the prefix.
    `allowed(new tokens so far)`: a constraint's tokens (bool [V]); the rest are cut to -inf
    before the warpers, as constrained decoding renormalises over what the grammar allows."""
    ids = list(prompt_ids)
    cache = DynamicCache(config=model.config) if use_cache else None
    fed = 0  # tokens of `ids` the cache holds
    new: list[int] = []
    while len(new) < max_new_tokens:
        if cache is None:
            logits = model(torch.tensor([ids], device=model.device)).logits[0, -1]
        else:
            step = torch.tensor([ids[fed:]], device=model.device)
            logits = model(step, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            fed = len(ids)
        logits = logits.float().cpu()
        if allowed is not None:
            logits = logits.masked_fill(~allowed(new), -math.inf)
        token = choose(logits, temperature, top_p, seed, position=len(ids))
        ids.append(token)
        new.append(token)
        if token in stop_ids:
            break
    return new


def reference_gap(logits: torch.Tensor, token: int, temperature: float, top_p: float, seed: int,
                  position: int) -> float:
    """How far the logits must move (in logits) before the loop picks `token` here, as
    tests/helpers/exactness.py bounds it, computed from the loop's own pieces: the argmax's lead when
    greedy; seeded, T log(1 + r) with r the distance from u to the token's interval of the
    normalised cumulative distribution (in token-id order)."""
    if temperature == 0:
        return float(logits.max() - logits[token])
    scores = warped(logits, temperature, top_p).double()
    weights = torch.exp(scores - scores.max())
    cumulative = torch.cumsum(weights, dim=0) / weights.sum()
    low = float(cumulative[token - 1]) if token > 0 else 0.0
    high = float(cumulative[token])
    u = uniform(seed, position)
    return temperature * math.log1p(max(low - u, u - high, 0.0))


@torch.inference_mode()
def ties_against_reference(model: PreTrainedModel, prompt_ids: list[int], tokens: list[int], max_new_tokens: int,
                           temperature: float, top_p: float, seed: int, stop_ids: Collection[int],
                           near_tie: float, reference: list[int] | None = None) -> list[tuple[int, float]]:
    """design.md section 8's rule with the loop as the reference: at the first difference the
    engine's token must be near-tied under the loop's own logits (gap <= `near_tie`), then the loop
    re-anchors on the engine's prefix up to that token and the comparison goes on to the end.
    `reference`: the loop's own reply to `prompt_ids` (reference_decode with its cache), when the
    caller has it already, as when several engines' replies are judged. Returns the accepted ties
    as (index, gap); raises AssertionError on any other difference."""
    if reference is None:
        reference = reference_decode(model, prompt_ids, max_new_tokens, temperature, top_p, seed, stop_ids,
                                     use_cache=True)
    ties: list[tuple[int, float]] = []
    start = 0
    while True:
        index = next((i for i in range(start, max(len(reference), len(tokens)))
                      if i >= min(len(reference), len(tokens)) or reference[i] != tokens[i]), None)
        if index is None:
            return ties
        assert index < min(len(reference), len(tokens)), f"lengths differ at token {index} after ties {ties}"
        prefix = prompt_ids + tokens[:index]
        logits = model(torch.tensor([prefix], device=model.device)).logits[0, -1].float().cpu()
        gap = reference_gap(logits, tokens[index], temperature, top_p, seed, len(prefix))
        assert gap <= near_tie, f"token {index}: the engine's {tokens[index]} is {gap:.2e} from the loop's " \
                               f"{reference[index]} (near-tie bound {near_tie:.0e}), after ties {ties}"
        ties.append((index, gap))
        rest = [] if tokens[index] in stop_ids else reference_decode(
            model, prefix + [tokens[index]], max_new_tokens - index - 1, temperature, top_p, seed, stop_ids,
            use_cache=True)
        reference = tokens[: index + 1] + rest
        start = index + 1


@torch.inference_mode()
def transformers_reply(model: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
                       stop_ids: Collection[int]) -> list[int]:
    """transformers' own reply to `prompt_ids`: greedy, its `generate(do_sample=False)` (no stop
    but `stop_ids`); seeded, the loop above with transformers' DynamicCache."""
    if sampling.temperature == 0:
        # one sequence: nothing is padded, but generate takes a stop token for padding without a pad id
        return hf_greedy(CausalLM(model), prompt_ids, max_new_tokens, stop_ids, pad_id=0)
    return reference_decode(model, prompt_ids, max_new_tokens, sampling.temperature, sampling.top_p, sampling.seed,
                            stop_ids, use_cache=True)


def assert_transformers_tokens(model: PreTrainedModel, prompt_ids: list[int], tokens: list[int], max_new_tokens: int,
                               sampling: SamplingParams, stop_ids: Collection[int], near_tie: float,
                               max_ties: int) -> list[tuple[int, float]]:
    """An engine's `tokens` are `model`'s own reply (transformers_reply) but at most `max_ties`
    near-ties within `near_tie` under `model`'s logits, each re-anchored (ties_against_reference).
    `model`: transformers' model of the engine's weights, read apart from the engine's loader, so
    that a bug the engines share (routing, expert order, sampling) shows. Returns the ties."""
    reference = transformers_reply(model, prompt_ids, max_new_tokens, sampling, stop_ids)
    ties = ties_against_reference(model, prompt_ids, tokens, max_new_tokens, sampling.temperature, sampling.top_p,
                                  sampling.seed, stop_ids, near_tie, reference)
    assert len(ties) <= max_ties, f"{len(ties)} near-ties, at most {max_ties}: {ties}"
    return ties
