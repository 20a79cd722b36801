"""The log-probabilities of a reply's tokens, as the target gave them where each was sampled: the
distribution verification already holds at each walked node (or the autoregressive step's), so
asking for them costs a log-softmax per emitted token and no extra forward."""

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    token: int
    logprob: float  # log p(token) under the target's distribution at its position (before temperature, top-p and any grammar)
    top: tuple[tuple[int, float], ...]  # the `top` likeliest tokens there with theirs, likeliest first


@dataclass
class TokenLog:
    """Filled by `sampling.emit_token` as the reply's tokens are emitted, in order."""

    top: int = 0  # alternatives to keep per token (OpenAI's top_logprobs: 0-20)
    entries: list[TokenLogprobs] = field(default_factory=list)

    def record(self, logits: torch.Tensor, token: int) -> None:
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        best = torch.topk(logprobs, self.top) if self.top else None
        top = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist()))
        self.entries.append(TokenLogprobs(token, float(logprobs[token]), top))
