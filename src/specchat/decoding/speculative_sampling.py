"""Speculative sampling: the accept/residual math shared by chain SD and SpecInfer.

One candidate (Leviathan et al. 2023; Chen et al. 2023)
-------------------------------------------------------
Let p be the filtered target distribution at a position and q the filtered draft distribution
the candidate x was sampled from. Accept x with probability min(1, p(x) / q(x)); otherwise emit
a sample of the residual r = (p - q)+ / sum (p - q)+. With beta = sum_y min(p, q)(y) the
acceptance probability, sum_y (p - q)+(y) = 1 - beta, so

    P(emit y) = q(y) min(1, p(y) / q(y)) + (1 - beta) r(y) = min(p, q)(y) + (p - q)+(y) = p(y).

Several candidates (SpecInfer's multi-step speculative sampling, Miao et al. 2023)
-----------------------------------------------------------------------------------
With candidates x_1, x_2, ... drawn i.i.d. from the same q, test x_1 against p; on rejection
replace p by the residual r and test x_2 against r (still with q), and so on; when they run out,
emit a sample of the current residual. x_j is independent of the rejections before it, so the
identity above holds for (r, q) in place of (p, q) at every step and, by induction from the last
candidate back, the emitted token follows p. A rejected x had p(x) < q(x), hence r(x) = 0: a
rejected token (or a later duplicate of it) is never emitted. With no candidate at all the
"residual" is p itself: chain SD's bonus token after a fully accepted chain.

Temperature 0 is the same math on one-hot distributions: x is accepted iff it is the target's
argmax, and the residual after a rejection is the one-hot of the target's argmax.

Randomness
----------
The proof needs each uniform to be fresh: independent of the candidates it judges and of every
other uniform that shaped the output. Sequoia reuses the same numbers every iteration, which
correlates consecutive decisions and breaks this. Here every uniform is the counter-based
``uniform(key, position)`` of keyed.py with a key derived from (seed, purpose, index), so the
draft token of stem s at position n, the acceptance test of the j-th candidate at position n and
the emission at position n each get their own stream, and no generator state depends on tree
size or iteration count: the same seed gives the same tokens and the same iterations. A number
keyed to position n is used at most once in the history that leads to the output: once position
n is emitted no later iteration decides anything there, and numbers drawn past the last emitted
position (draft tokens of a discarded continuation) influenced nothing that was emitted, so
drawing them again in the next iteration is their first use.
"""

from collections.abc import Sequence

import torch

from specchat.decoding.events import SamplingParams
from specchat.decoding.keyed import Purpose, derived_uniform
from specchat.decoding.sampling import invert_cdf, sampled_probs


def distribution(logits: torch.Tensor, sampling: SamplingParams, position: int) -> torch.Tensor:
    """Float64 [V] next-token distribution as sampled from 1-D logits at absolute `position`:
    temperature and the cuts, or at temperature 0 the one-hot of the first maximum (what
    `sample_token` picks)."""
    if sampling.temperature == 0:
        return torch.nn.functional.one_hot(torch.argmax(logits), logits.shape[-1]).double()
    return sampled_probs(logits, sampling, position)


def accepts(p: torch.Tensor, q: torch.Tensor, token: int, u: float) -> bool:
    """Whether u decides to accept `token` (sampled from q): u < p / q, i.e. probability
    min(1, p / q) for u uniform in [0, 1). Written u q < p: q(token) > 0 as it was sampled."""
    return u * float(q[token]) < float(p[token])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): what p still needs after a rejected draw from q.

    The mass is 0 only when p <= q everywhere, i.e. p == q up to rounding (both sum to 1); a
    rejection then had probability ~0, and p is the limit of the residual that fits the proof.
    """
    excess = (p - q).clamp(min=0)
    total = float(excess.sum())
    return excess / total if total > 0 else p


def first_accepted(
    p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int], seed: int, position: int
) -> tuple[int | None, torch.Tensor]:
    """Multi-step speculative sampling at one position: test the candidate tokens (i.i.d. from
    q, in the order they were sampled) in turn. Returns the rank of the first accepted one, or
    None and the residual to emit from when all are rejected (p itself if there were none)."""
    for rank, token in enumerate(candidates):
        if accepts(p, q, token, derived_uniform(seed, Purpose.ACCEPT, rank, position)):
            return rank, p
        p = residual(p, q)
    return None, p


def emit(p: torch.Tensor, seed: int, position: int) -> int:
    """The target-side token at `position`: inverse CDF of p at the position's EMIT uniform."""
    return invert_cdf(p, derived_uniform(seed, Purpose.EMIT, 0, position))


def draw_draft(q: torch.Tensor, seed: int, stem: int, position: int) -> int:
    """Stem `stem`'s draft token at `position`: inverse CDF of q at its DRAFT uniform."""
    return invert_cdf(q, derived_uniform(seed, Purpose.DRAFT, stem, position))
