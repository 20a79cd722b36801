"""Logit bias and repetition penalties, as llama.cpp, vLLM and OpenAI apply them to a model's logits
before temperature and the cuts.

For each token t counted in the tokens before position n (its count c_t), with the bias b_t:
  z_t <- z_t + b_t                                  (logit_bias)
  z_t <- z_t / r if z_t > 0 else z_t * r            (repetition: CTRL's; HF's repetition_penalty)
  z_t <- z_t - c_t * frequency - [c_t > 0] * presence
each penalty counting the tokens of its own window: the last N of the prompt's and the reply's
(llama.cpp and Ollama: N = repeat_last_n for all three), or all of them (vLLM's repetition), or
the reply's alone (OpenAI's presence and frequency); and last llama.cpp's DRY (dry.py), over its
own window.

Why speculation stays exact: the penalized logits at position n depend only on the target's logits
there and the tokens before n, so at a tree node whose path is the emitted prefix they are what
sequential decoding computes at that prefix, and sampling.py's argument (u_n keyed by position,
inverse CDF in id order) carries over unchanged, as for a grammar (guide.py). Every engine that
keeps them emits through sampling.emit_token, in order, so one running window per reply suffices.
The draft's tree grows unpenalized: it only proposes.
"""

from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from specchat.decoding.dry import Dry, DryWindow, Restarts, dry_when_on
from specchat.decoding.events import SamplingParams


@dataclass(frozen=True)
class Window:
    """Which tokens before a position a penalty counts."""

    last: int = -1  # the last `last` of them; -1: all
    prompt: bool = True  # False: the reply's tokens only


@dataclass(frozen=True)
class Penalties:
    """One request's logit bias and penalties; `start` gives a reply its running state."""

    bias: tuple[tuple[int, float], ...] = ()  # (token, added to its logit)
    repeat: float = 1.0  # 1: off
    repeat_window: Window = Window()
    presence: float = 0.0
    frequency: float = 0.0
    count_window: Window = Window(prompt=False)
    dry: Dry | None = None  # llama.cpp's DRY, after the others (decoding/dry.py)

    @property
    def active(self) -> bool:
        """Whether any logit can change: a reply without any keeps the path it had without them."""
        return (bool(self.bias) or self.repeat != 1.0 or self.presence != 0.0 or self.frequency != 0.0
                or (self.dry is not None and self.dry.active))

    def start(self, prompt_ids: Sequence[int]) -> "Repeats":
        return Repeats(self, prompt_ids)


def llama_penalties(repeat_penalty: float, repeat_last_n: int, presence_penalty: float = 0.0,
                    frequency_penalty: float = 0.0, dry: Dry | None = None) -> Penalties:
    """llama-cli's --repeat-penalty, --presence-penalty and --frequency-penalty, all over its
    --repeat-last-n window of the prompt and the reply, and its DRY."""
    window = Window(last=repeat_last_n)
    return Penalties(repeat=repeat_penalty, repeat_window=window, presence=presence_penalty,
                     frequency=frequency_penalty, count_window=window, dry=dry)


def settings_penalties(settings: Mapping[str, Any], restarts: Callable[[], Restarts]) -> Penalties:
    """llama-cli's penalties and DRY from the settings the command line and the chat name alike
    (cli_options.PenaltyOptions' names); DRY's breakers' tokens asked of `restarts` only where it is on."""
    dry = dry_when_on(settings["dry_multiplier"], settings["dry_base"], settings["dry_allowed_length"],
                      settings["dry_penalty_last_n"], restarts)
    return llama_penalties(settings["repeat_penalty"], settings["repeat_last_n"], settings["presence_penalty"],
                           settings["frequency_penalty"], dry)


def counted_from(sampling: SamplingParams, penalties: Penalties | None, prompt_ids: Sequence[int]) -> SamplingParams:
    """`sampling` under `penalties`, counting from `prompt_ids`; as it is where they change nothing."""
    if penalties is None or not penalties.active:
        return sampling
    return replace(sampling, penalties=penalties.start(prompt_ids))


class Tally:
    """Counts of the tokens in a window as tokens are added."""

    def __init__(self, window: Window, prompt_ids: Sequence[int]) -> None:
        self.size = None if window.last < 0 else window.last
        self.tokens: deque[int] = deque(maxlen=self.size)
        self.counts: Counter[int] = Counter()
        for token in prompt_ids if window.prompt else ():
            self.add(token)

    def add(self, token: int) -> None:
        if self.size == 0:
            return
        if len(self.tokens) == self.size:  # the oldest leaves the window as this one enters
            oldest = self.tokens[0]
            self.counts[oldest] -= 1
            if not self.counts[oldest]:
                del self.counts[oldest]
        self.tokens.append(token)
        self.counts[token] += 1

    def ids_and_counts(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(list(self.counts), dtype=torch.long, device=device)
        return ids, torch.tensor(list(self.counts.values()), dtype=torch.float32, device=device)


class Repeats:
    """One reply's penalties at the tokens emitted so far (the prompt's first)."""

    def __init__(self, penalties: Penalties, prompt_ids: Sequence[int]) -> None:
        self.penalties = penalties
        # the bias's tokens and values, made once a reply: added at every emitted position
        self.bias_ids = torch.tensor([token for token, _ in penalties.bias], dtype=torch.long)
        self.bias_values = torch.tensor([value for _, value in penalties.bias], dtype=torch.float32)
        self.repeated = Tally(penalties.repeat_window, prompt_ids)
        self.counted = Tally(penalties.count_window, prompt_ids)
        self.dry = DryWindow(penalties.dry, prompt_ids) if penalties.dry is not None and penalties.dry.active else None

    def penalized(self, logits: torch.Tensor) -> torch.Tensor:
        """1-D logits [V] with the bias and penalties at the current position (a float32 copy)."""
        scores, spec = logits.float().clone(), self.penalties
        if spec.bias:
            scores.index_add_(0, self.bias_ids.to(scores.device), self.bias_values.to(scores.device))
        if spec.repeat != 1.0 and self.repeated.counts:
            ids, _ = self.repeated.ids_and_counts(scores.device)
            picked = scores[ids]
            scores[ids] = torch.where(picked > 0, picked / spec.repeat, picked * spec.repeat)
        if (spec.presence or spec.frequency) and self.counted.counts:
            ids, counts = self.counted.ids_and_counts(scores.device)
            scores[ids] -= counts * spec.frequency + spec.presence
        if self.dry is not None:
            self.dry.penalize(scores)
        return scores

    def accept(self, token: int) -> None:
        """Move past an emitted token."""
        self.repeated.add(token)
        self.counted.add(token)
        if self.dry is not None:
            self.dry.accept(token)
