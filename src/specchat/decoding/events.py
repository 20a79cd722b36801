"""The engine protocol: every engine is a generator of per-iteration events, and exposes the
live settings it honours so that front ends never need to know which engine they hold."""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # llguidance loads only where a reply is constrained
    import torch

    from specchat.decoding.guide import Guide
    from specchat.decoding.mirostat import Surprise
    from specchat.decoding.penalties import Repeats
    from specchat.decoding.prediction import Prediction
    from specchat.decoding.token_log import TokenLog, TokenLogprobs


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; temperature 0 means greedy."""

    temperature: float = 0.6
    top_p: float = 0.9
    seed: int = 0
    top_k: int = 0  # keep the k likeliest tokens (0: all), before top-p
    min_p: float = 0.0  # after top-p, drop tokens less likely than min_p x the likeliest (0: none)
    typical_p: float = 1.0  # after min-p, keep the tokens of locally typical surprise up to this mass (1: all)
    top_n_sigma: float = -1.0  # first, keep the tokens within n standard deviations of the top logit (<= 0: all)
    xtc_probability: float = 0.0  # last, XTC: how often it drops the likeliest tokens (decoding/llama_cuts.py)
    xtc_threshold: float = 0.1  # XTC drops the tokens at least this likely but the least of them
    dynatemp_range: float = 0.0  # > 0: the temperature set by the cut distribution's entropy (decoding/dynatemp.py)
    dynatemp_exponent: float = 1.0  # how that entropy maps onto [temperature - range, temperature + range]
    guide: "Guide | None" = None  # one reply's grammar: tokens it forbids are never sampled (decoding/guide.py)
    token_log: "TokenLog | None" = None  # one reply's: gains each emitted token's log-probabilities
    penalties: "Repeats | None" = None  # one reply's logit bias and repetition penalties (decoding/penalties.py)
    mirostat: "Surprise | None" = None  # one reply's mirostat, in place of the cuts (decoding/mirostat.py)
    # one reply's predicted output: SpecExec's trees hold it as a chain, the tokens unchanged (decoding/prediction.py)
    prediction: "Prediction | None" = None

    @property
    def has_forms(self) -> bool:
        """Whether the reply asks what only an engine that `keeps_forms` does: a grammar, a token
        log, penalties, mirostat (each a function of the emitted prefix, applied as every token is
        emitted)."""
        return (self.guide is not None or self.token_log is not None or self.penalties is not None
                or self.mirostat is not None)


@dataclass(frozen=True)
class IterationEvent:
    """What one decoding iteration (one target forward) produced and cost."""

    token_ids: list[int]  # new tokens emitted this iteration, in order
    accepted: int  # draft tokens accepted (token_ids minus the one the target supplied)
    tree_size: int  # draft tokens scored by the target (0 for autoregressive)
    depth: int  # depth of the draft tree
    draft_s: float
    target_s: float
    transfer_s: float = 0.0  # time the target's weight streaming was busy (offload)
    transfer_bytes: int = 0  # target weight bytes streamed during the iteration
    stall_s: float = 0.0  # time the target's compute waited for streamed weights
    start_stall_s: float = 0.0  # of `stall_s`, the wait for the pass's first streamed layer (drafting did not cover it)
    link_idle: float = 0.0  # share of the iteration's wall time the weight link moved nothing while it had more to move
    finished: bool = False  # True on the last event (EOS or token limit)
    # DSI only: verification jobs sent to target workers, cancelled because a draft they
    # build on was rejected, and still queued or running, at this event.
    jobs_submitted: int = 0
    jobs_preempted: int = 0
    jobs_in_flight: int = 0
    notice: str = ""  # a one-line remark for the user (e.g. fewer DSI workers than needed)
    draft_steps: int = 0  # draft forwards spent growing the tree (tree engines)
    tree_host_s: float = 0.0  # of draft_s, SpecExec's tree bookkeeping on the host, outside the draft's steps
    # the draft's steps captured as CUDA graphs this iteration: each a one-time cost in draft_s (two
    # eager warm-ups and the capture), paid at a step shape's second use (decoding/static_step.py)
    graphs_captured: int = 0
    # Tree engines: the target's forward over the tree; the rest of target_s is verification (the
    # head's rows, the walk) and both caches' pruning. 0 where no tree was scored.
    pass_s: float = 0.0
    predicted_accepted: float = 0.0  # --budget auto: accepted tokens the tree predicted (calibrated)
    # --budget auto: DRAFTED, ALONE (the target alone emitted one token: predicted faster) or LOOK
    # (a tree drafted while the target alone is faster, to measure acceptance again); "" otherwise.
    drafting: str = ""
    rate_with_tree: float = 0.0  # --budget auto: the tokens/s the last drafting iterations achieved (0: not judged yet)
    rate_alone: float = 0.0  # and the tokens/s it predicted for the target alone
    # First event of a reply only: prompt tokens run this reply (those past the prefix the
    # engine's caches reused) and the seconds that took (dsi: its drafter's prefill).
    prefill_tokens: int = 0
    prefill_s: float = 0.0


AUTO = "auto"  # a budget chosen per iteration by the tree's predicted acceptance and measured costs
DRAFTED, ALONE, LOOK = "drafted", "alone", "look"  # IterationEvent.drafting under --budget auto


@dataclass(frozen=True)
class LiveSettings:
    """Settings an engine reads while it decodes, so a change applies from its next iteration
    (or next dsi job). None marks a setting the engine does not honour."""

    budget: int | str | None = None  # K: draft tree size (tree engines), or AUTO
    depth: int | None = None  # D: deepest draft tree node (tree engines)
    lookahead: int | None = None  # dsi: drafts per verification job
    workers: int | None = None  # dsi: target workers (shown, never changed live)
    ranked_tree: bool | None = None  # tree engines, measurement only: trees by rank (tree.TreeShape)


class Engine(Protocol):
    """Decodes a reply to a prompt, yielding one event per target forward."""

    name: str
    # Keeps a reply to `SamplingParams.guide`, fills its `token_log` and applies its `penalties`;
    # False: refuses them (front ends refuse such a request before anything is queued or streamed).
    keeps_forms: bool

    def live_settings(self) -> LiveSettings:
        """The settings this engine honours, with the values it holds now."""
        ...

    def apply(self, settings: LiveSettings) -> None:
        """Adopt the fields of `settings` this engine honours; fields it does not honour, and
        None fields, are ignored."""
        ...

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        """The reply's events. The engine keeps its caches afterwards: a prompt that shares a
        prefix with the last sequence it produced prefills only the rest."""
        ...

    def forget(self) -> None:
        """Drop the kept caches (a new conversation); the next prompt is prefilled in full."""
        ...

    def embed(self, token_ids: list[int], pooling: str) -> "torch.Tensor":
        """The target's embedding of `token_ids` (decoding/embedding.py), float32 on the CPU; the
        kept caches are left as they were."""
        ...

    def score(self, token_ids: list[int], top: int) -> "list[TokenLogprobs]":
        """The target's log-probability of each of token_ids[1:] after the ones before it, with the
        `top` likeliest tokens there (decoding/prompt_logprobs.py); the kept caches then hold
        `token_ids`, so a reply to them next computes only their last token again."""
        ...
