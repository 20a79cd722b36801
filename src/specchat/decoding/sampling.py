"""Token sampling that every lossless engine reproduces exactly.

Why the same seed gives the same tokens in SpecExec and in autoregressive decoding
-------------------------------------------------------
Sequential sampling emits token n as ``F_n^{-1}(u_n)``: the inverse CDF of the filtered target
distribution ``p_n`` (temperature and the cuts) at position n, evaluated at a uniform number
``u_n``. Two choices make that value independent of how the engine got there:

* ``u_n = uniform(seed, n)`` (keyed.py) is a pure function of the seed and the absolute position n. It
  consumes no generator state, so it does not matter how many draft nodes, tree branches or
  verification steps an engine evaluated before reaching position n.
* The inverse CDF runs over token ids in id order (not sorted by probability), so the token is
  a function of ``p_n`` and ``u_n`` alone.

A lossless engine (SpecExec verification, or plain autoregressive decoding) computes ``p_n``
from the same prefix of already-emitted tokens. By induction on n, if tokens ``< n`` agree, the
prefix agrees, so ``p_n`` agrees, and with the same ``u_n`` the token at n agrees. Speculation
then changes only how many target forwards are needed, never which tokens come out (given that
the target's logits at a tree node equal the sequential ones, e.g. in float32).
"""

import math

import torch

from specchat.decoding.dynatemp import dynatemp_probs
from specchat.decoding.events import SamplingParams
from specchat.decoding.guide import masked
from specchat.decoding.keyed import uniform
from specchat.decoding.llama_cuts import cut_top_n_sigma, cut_xtc, xtc_cuts_at

# The fast nucleus search looks at this many top tokens; a wider nucleus takes the full sort.
FAST_CANDIDATES = 256
# How far the tail mass must lie from 1 - top_p for the fast search to trust its side of the cut.
# HF's cumulative masses are float32: a softmax whose float32 sum loses at most the tokens too
# small to register beside the running total (a few 1e-5 of the mass over a 151,936-token
# vocabulary), then a double-accumulated cumsum rounded to float32 (1e-7). 1e-3 covers that many
# times over; a cut that close runs HF's computation itself.
CUT_MARGIN = 1e-3


def cut_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering with HF ``TopPLogitsWarper`` semantics (min_tokens_to_keep=1).

    Sorting ascending, a token is removed when the probability mass of it and of every token
    below it is <= 1 - top_p; the top token is always kept. The result is bit-identical to HF's:
    either the kept set is found from the top candidates alone (`nucleus_floor`), or HF's own
    computation runs.
    """
    floor = nucleus_floor(scores, top_p)
    if floor is None:
        return cut_top_p_by_sorting(scores, top_p)
    return scores.masked_fill(scores < floor, -float("inf"))


def cut_top_p_by_sorting(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """HF's computation: same sort call as HF so that ties land in the same order."""
    sorted_scores, sorted_ids = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(-1, sorted_ids, remove_sorted)
    return scores.masked_fill(remove, -float("inf"))


def nucleus_floor(scores: torch.Tensor, top_p: float) -> float | None:
    """The lowest score HF's cut keeps, found without sorting the vocabulary, or None when the
    search cannot be sure of HF's answer.

    HF removes the longest ascending run whose cumulative mass stays <= 1 - top_p, so it keeps
    the top k tokens for the least k >= 1 whose tail mass T_k (everything below the top k) is
    <= 1 - top_p. The masses come from one float64 log-sum-exp and the top candidates (a 9 ms
    sort of 151,936 scores becomes a 0.3 ms top-k). The answer is HF's when T_k and T_{k-1}
    lie more than CUT_MARGIN from 1 - top_p (so rounding cannot move the cut) and the k-th and
    (k+1)-th scores differ (so the tie order of HF's sort cannot decide which tokens stay).
    """
    if scores.dim() != 1 or scores.dtype not in (torch.float32, torch.float64):
        return None
    total = torch.logsumexp(scores.double(), dim=0)
    if not torch.isfinite(total):
        return None
    candidates = min(FAST_CANDIDATES, scores.numel())
    top = torch.topk(scores, candidates).values
    tail = 1.0 - (top.double() - total).exp().cumsum(dim=0)  # tail[k - 1] = T_k
    limit = 1 - top_p
    within = torch.nonzero(tail <= limit)
    if within.numel() == 0:
        return None  # the nucleus is wider than the candidates
    k = int(within[0]) + 1
    clear_below = float(tail[k - 1]) < limit - CUT_MARGIN
    clear_above = k == 1 or float(tail[k - 2]) > limit + CUT_MARGIN
    untied = k == scores.numel() or (k < candidates and bool(top[k] < top[k - 1]))
    return float(top[k - 1]) if clear_below and clear_above and untied else None


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
                  min_p: float = 0.0, typical_p: float = 1.0, top_n_sigma: float = -1.0,
                  xtc_threshold: float | None = None) -> torch.Tensor:
    """Logits [..., V] divided by temperature, then cut to -inf: top-n-sigma (<= 0: no cut), top-k (0:
    no cut), top-p (>= 1: no cut), min-p (0: no cut), typical-p (>= 1: no cut), and XTC at
    `xtc_threshold` where its coin fell at the position (None: no cut).

    From temperature to typical-p, the order transformers' `generate` chains them in, and
    bit-identical to HF ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``,
    ``MinPLogitsWarper`` and ``TypicalLogitsWarper`` one after the other; top-n-sigma and XTC,
    which transformers lacks, are llama.cpp's (llama_cuts.py says where its chain puts them).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to filter logits, got {temperature}")
    scores = logits / temperature
    if top_n_sigma > 0:
        scores = cut_top_n_sigma(scores, top_n_sigma)
    if top_k > 0:
        scores = cut_top_k(scores, top_k)
    if top_p < 1.0:
        scores = cut_top_p(scores, top_p)
    if min_p > 0.0:
        scores = cut_min_p(scores, min_p)
    if typical_p < 1.0:
        scores = cut_typical(scores, typical_p)
    if xtc_threshold is not None:
        scores = cut_xtc(scores, xtc_threshold)
    return scores


def cut_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Scores below the k-th largest cut to -inf (a tie with it stays), as HF's TopKLogitsWarper."""
    kth = torch.topk(scores, min(top_k, scores.shape[-1]))[0][..., -1:]
    return scores.masked_fill(scores < kth, -math.inf)


def cut_min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Scores whose probability (a softmax in their dtype, as HF's MinPLogitsWarper takes it) is
    below min_p x the likeliest's cut to -inf; the likeliest always stays, as min_p <= 1."""
    probs = torch.softmax(scores, dim=-1)
    return scores.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), -math.inf)


def cut_typical(scores: torch.Tensor, mass: float) -> torch.Tensor:
    """Locally typical sampling (Meister et al. 2022), as HF's TypicalLogitsWarper: tokens ranked by
    how far their surprise -log p lies from the distribution's entropy H; the closest kept until
    their mass reaches `mass` (the token that reaches it too, and at least one).

    HF's own operations on [B, V] rows, so the cut set is its, bit for bit (ties included)."""
    rows = scores.reshape(-1, scores.shape[-1])
    logp = torch.log_softmax(rows, dim=-1)
    entropy = -(logp * logp.exp()).nansum(-1, keepdim=True)  # a cut token's 0 * -inf is nan: left out
    distance, order = torch.sort((-logp - entropy).abs(), descending=False)
    cumulative = rows.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=1).clamp_(max=distance.shape[-1] - 1)
    remove_sorted = distance > distance.gather(1, last.view(-1, 1))
    remove_sorted[..., :1] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return rows.masked_fill(remove, -math.inf).reshape(scores.shape)


def filtered_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
                   min_p: float = 0.0, typical_p: float = 1.0, top_n_sigma: float = -1.0,
                   xtc_threshold: float | None = None) -> torch.Tensor:
    """Float64 probabilities [..., V] after `filter_logits`' cuts; cut tokens get exactly 0."""
    return filter_logits(logits, temperature, top_p, top_k, min_p, typical_p, top_n_sigma,
                         xtc_threshold).double().softmax(dim=-1)


def sampled_probs(logits: torch.Tensor, params: SamplingParams, position: int) -> torch.Tensor:
    """The filtered distribution under a reply's sampling (temperature > 0) at absolute `position`;
    under a dynamic temperature, llama.cpp's order: the cuts on the untempered logits, then the
    temperature their entropy sets (dynatemp.py)."""
    if params.dynatemp_range > 0:
        return dynatemp_probs(position_cuts(logits, params, position, 1.0), params.temperature,
                              params.dynatemp_range, params.dynatemp_exponent)
    return position_cuts(logits, params, position, params.temperature).double().softmax(dim=-1)


def position_cuts(logits: torch.Tensor, params: SamplingParams, position: int, temperature: float) -> torch.Tensor:
    """`filter_logits` at `temperature` with the reply's cuts, XTC's where its coin (keyed at
    `position`) fell."""
    xtc = params.xtc_threshold if xtc_cuts_at(params.seed, position, params.xtc_probability) else None
    return filter_logits(logits, temperature, params.top_p, params.top_k, params.min_p, params.typical_p,
                         params.top_n_sigma, xtc)


def invert_cdf(probs: torch.Tensor, u: float) -> int:
    """The smallest token id i with cdf[i] > u * cdf[-1], cdf summed in token-id order.

    probs is 1-D and need not be normalised; u is in [0, 1). The sums run in float64 (in
    float32, u = 1 - 2**-53 would round to 1). No clamp is needed, and the id found always has
    probs[i] > 0, even with rounding:
    * some id passes: for u <= 1 - 2**-53 and a normal total T > 0, u * T < T in doubles
      (T * 2**-53 is at least half an ulp of T, and exactly half only when T is a power of two,
      where T - ulp/2 is representable), so at least the last id passes;
    * the first passing id i has cdf[i] > u * T >= cdf[i - 1], and cdf[i] = fl(cdf[i - 1] +
      probs[i]) equals cdf[i - 1] when probs[i] == 0, so probs[i] > 0.
    """
    cdf = probs.double().cumsum(dim=0)
    passes = cdf > u * cdf[-1]
    # argmax returns the first maximum, i.e. the first passing id.
    return int(passes.to(torch.uint8).argmax())


def emit_token(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The token an engine emits at ``position``: ``sample_token`` over the target's logits with
    the reply's bias and penalties (penalties.py), masked to what its guide allows (the mask before
    temperature and top-p, so a constrained reply samples the renormalised allowed distribution),
    or under mirostat its cut (mirostat.py) in place of the others; the guide and the penalties
    then move past it, and the reply's token log records it (from the target's own logits); a
    predicted output's cursor follows it."""
    scores = logits if params.penalties is None else params.penalties.penalized(logits)
    if params.guide is not None:
        scores = masked(scores, params.guide.allowed()[0])
    if params.mirostat is not None and params.temperature > 0:
        token = params.mirostat.pick(scores / params.temperature, uniform(params.seed, position))
    else:
        token = sample_token(scores, params, position)
    if params.guide is not None:
        params.guide.accept(token)
    if params.penalties is not None:
        params.penalties.accept(token)
    if params.token_log is not None:
        params.token_log.record(logits, token)
    if params.prediction is not None:
        params.prediction.accept(token)
    return token


def sample_token(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The token at absolute position ``position`` from 1-D logits [V].

    Temperature 0 is greedy (first maximum). Otherwise inverse-CDF sampling of the filtered
    distribution at ``u = uniform(params.seed, position)``; see the module docstring for why
    this makes every lossless engine emit the same tokens as sequential sampling.
    """
    if params.temperature == 0:
        return int(torch.argmax(logits))
    return invert_cdf(sampled_probs(logits, params, position), uniform(params.seed, position))
