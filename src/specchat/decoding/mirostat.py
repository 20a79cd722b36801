"""Mirostat (Basu et al. 2021), as llama.cpp samples it: a reply aims at a surprise of tau bits a
token by feedback. A threshold mu starts at 2 tau; after each token, whose surprise under the cut
distribution is s = -log2 p, mu <- mu - eta (s - tau).
- Version 2 keeps the tokens whose surprise is at most mu (the likeliest always).
- Version 1 fits a Zipf exponent s^ to the likeliest m = 100 tokens (least squares over
  t_i = ln((i + 2) / (i + 1)), b_i = ln(p_i / p_(i+1))) and keeps the k likeliest, where, with
  eps = s^ - 1 over a vocabulary of N, k = (eps 2^mu / (1 - N^-eps))^(1 / s^).
Both cut the distribution after temperature alone: top-k, top-p, min-p, typical-p, top-n-sigma and
XTC are not applied under mirostat, as llama.cpp chains it (the bias and penalties before it are).

Why speculation stays exact: mu at position n is a function of the target's distributions at the
emitted positions before n and the tokens emitted there, so at a tree node on the emitted path the
cut is the one sequential decoding makes; every engine that keeps a reply's forms emits through
sampling.emit_token, in order, which picks with the position's u_n (sampling.py) and moves mu, as
for the penalties (penalties.py). Temperature 0 stays greedy: the cut always keeps the likeliest.
"""

import math
from dataclasses import dataclass

import torch

from specchat.decoding.sampling import invert_cdf

FIT_TOKENS = 100  # llama.cpp's m: the likeliest tokens version 1 fits its exponent to


@dataclass(frozen=True)
class Mirostat:
    """One reply's mirostat: version 1 or 2, the target surprise tau (bits) and the rate eta."""

    version: int
    tau: float = 5.0
    eta: float = 0.1

    def start(self) -> "Surprise":
        return Surprise(self)


def mirostat_state(version: int, tau: float, eta: float) -> "Surprise | None":
    """A reply's fresh state of mirostat `version` (0: none)."""
    return Mirostat(version, tau, eta).start() if version else None


class Surprise:
    """A reply's mirostat state: mu, moved by each emitted token."""

    def __init__(self, spec: Mirostat) -> None:
        self.spec = spec
        self.mu = 2 * spec.tau

    def probs(self, scores: torch.Tensor) -> torch.Tensor:
        """Float64 probabilities [V] of temperature-scaled scores, cut at the current mu and renormalised."""
        probs = scores.double().softmax(dim=-1)
        keep = self.kept_v2(probs) if self.spec.version == 2 else self.kept_v1(probs)
        cut = torch.where(keep, probs, 0.0)
        return cut / cut.sum()

    def kept_v2(self, probs: torch.Tensor) -> torch.Tensor:
        keep = -torch.log2(probs) <= self.mu
        keep[int(torch.argmax(probs))] = True
        return keep

    def kept_v1(self, probs: torch.Tensor) -> torch.Tensor:
        """The k likeliest (ties by token id), k from the exponent fitted to the likeliest tokens."""
        order = torch.sort(probs, descending=True, stable=True).indices
        top = probs[order[:FIT_TOKENS]]
        top = top[top > 0]  # a banned token's 0 would make its ratio infinite
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order[:self.kept_count(top, probs.numel())]] = True
        return keep

    def kept_count(self, top: torch.Tensor, vocabulary: int) -> int:
        if top.numel() < 2:
            return 1
        i = torch.arange(top.numel() - 1, dtype=torch.float64)
        t = torch.log((i + 2) / (i + 1))
        s_hat = float((t * torch.log(top[:-1] / top[1:])).sum() / (t * t).sum())
        if s_hat <= 0:  # the fitted tokens are equally likely: no Zipf tail to cut
            return vocabulary
        eps = s_hat - 1
        # eps / (1 - N^-eps), which tends to 1 / ln N as eps -> 0; k in logs, as 2^mu may overflow
        ratio = eps / -math.expm1(-eps * math.log(vocabulary)) if eps else 1 / math.log(vocabulary)
        log_k = (math.log(ratio) + self.mu * math.log(2)) / s_hat
        return vocabulary if log_k >= math.log(vocabulary) else max(1, int(math.exp(log_k)))

    def pick(self, scores: torch.Tensor, u: float) -> int:
        """The token at u (inverse CDF in id order) from the cut distribution; mu moves past it."""
        probs = self.probs(scores)
        token = invert_cdf(probs, u)
        self.move(probs, token)
        return token

    def move(self, probs: torch.Tensor, token: int) -> None:
        """mu past `token`, picked from the cut distribution `probs`: by eta times its surprise less tau."""
        self.mu -= self.spec.eta * (-math.log2(float(probs[token])) - self.spec.tau)
