"""The tree engines' `Engine`: a reply as iterations of SpecExec's loop (specexec.py: catch up,
grow, score, walk, prune) with the engine's strategy, the first token from the prompt's own
target pass, and under --budget auto the choice, before each iteration, between drafting a tree
and the target alone. Also the live settings, the prefix reuse between replies and each event's
share of the streamed bytes.
"""

from collections.abc import Collection, Iterator
from dataclasses import replace

import torch
from transformers import DynamicCache

from specchat.decoding.autoregressive import next_token
from specchat.decoding.autosize import AutoSizer, Observed
from specchat.decoding.embedding import embedding
from specchat.decoding.events import ALONE, AUTO, DRAFTED, LOOK, IterationEvent, LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length
from specchat.decoding.prefix import PrefixCache, Reuse, with_prefill
from specchat.decoding.prompt_logprobs import prompt_logprobs
from specchat.decoding.token_log import TokenLogprobs
from specchat.decoding.specexec import Iteration, TreeStrategy, iterate
from specchat.decoding.tree import TreeShape
from specchat.device_clock import now
from specchat.errors import SpecchatError
from specchat.transfer import TransferStats


class TreeEngine:
    """An `Engine` that drafts a tree per target pass, as its strategy says."""

    def __init__(self, strategy: TreeStrategy, target: CausalLM, draft: CausalLM, stop_ids: Collection[int],
                 shape: TreeShape, sizer: AutoSizer | None = None) -> None:
        """`strategy`: SPECEXEC (specexec.py), SPECINFER (specinfer.py) or CHAIN_SD (chain_sd.py).
        `sizer` makes `--budget auto` available (SpecExec only; without one, auto is not honoured
        and the budget stays as it is); `shape.sizer` set means the engine starts in auto."""
        self.name = strategy.name
        self.keeps_forms = strategy.guided
        self.strategy = strategy
        self.target = target
        self.draft = draft
        self.stop_ids = frozenset(stop_ids)
        self.sizer = sizer or shape.sizer
        self.shape = shape  # read at every iteration, so a live change applies from the next one
        self.history = PrefixCache(2)  # the target's cache, then the draft's
        self.transfer_mark = TransferStats()  # the link's counters when the last event took its share

    def live_settings(self) -> LiveSettings:
        budget = AUTO if self.shape.sizer is not None else self.shape.budget
        return LiveSettings(budget=budget, depth=self.shape.max_depth)

    def apply(self, settings: LiveSettings) -> None:
        depth = settings.depth if settings.depth is not None else self.shape.max_depth
        ranked = settings.ranked_tree if settings.ranked_tree is not None else self.shape.ranked_tree
        self.shape = replace(self.shape, max_depth=depth, ranked_tree=ranked)
        if settings.budget == AUTO:
            if self.sizer is not None:  # an engine without one does not honour auto: it keeps its size
                self.shape = replace(self.shape, sizer=self.sizer, budget=self.sizer.cap)
        elif settings.budget is not None:
            self.shape = replace(self.shape, sizer=None, budget=settings.budget)

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        """Decode a reply; both caches are kept afterwards, and the next prompt reuses its common
        prefix with the sequence this reply ends (prefix.py)."""
        if sampling.has_forms and not self.keeps_forms:
            raise SpecchatError(f"--engine {self.name} cannot keep a reply to a grammar, log its tokens' "
                                "probabilities, penalize repeats or sample by mirostat: use specexec or autoregressive")
        yield from self.history.guard(self.decode(self.history.begin(prompt_ids), max_new_tokens, sampling))

    def forget(self) -> None:
        self.history.forget()

    def embed(self, token_ids: list[int], pooling: str) -> torch.Tensor:
        return embedding(self.target, token_ids, pooling)

    def score(self, token_ids: list[int], top: int) -> list[TokenLogprobs]:
        return self.history.from_start(token_ids, lambda cache: prompt_logprobs(self.target, token_ids, top, cache))

    def decode(self, reuse: Reuse, max_new_tokens: int, sampling: SamplingParams) -> Iterator[IterationEvent]:
        """The prompt's new tokens run through the target first, and their last row gives the
        first token at once: the time to the first token is the prefill's, as without a draft,
        and the first token is sampled the same way whatever the engine (a /retry repeats it).
        The trees grow from there; the draft runs its share of the prompt in the first one."""
        if max_new_tokens <= 0:
            return
        seq, (target_cache, draft_cache) = reuse.tokens, reuse.caches
        self.transfer_mark = self.target.transfer_stats()
        event = self.target_alone(seq, target_cache, sampling, max_new_tokens)  # the prompt's pass
        produced = 1
        yield with_prefill(event, reuse, event.target_s)
        while not event.finished:
            event = self.iterate(seq, target_cache, draft_cache, sampling, max_new_tokens - produced)
            produced += len(event.token_ids)
            yield event

    def target_alone(self, seq: list[int], cache: DynamicCache, sampling: SamplingParams,
                     max_tokens: int) -> IterationEvent:
        """The autoregressive step: the target runs what `cache` lacks of `seq` (the prompt, for the
        first token; else the root) and samples the next token, which `seq` gains, so the loop's
        invariant holds after it; the draft runs nothing."""
        start = now(self.target.device)
        token = next_token(self.target, seq, cache, sampling)
        seq.append(token)
        elapsed = now(self.target.device) - start
        moved = self.take_transfer()  # after the synchronize: every wait of the pass is counted
        return IterationEvent(
            token_ids=[token], accepted=0, tree_size=0, depth=0, draft_s=0.0, target_s=elapsed,
            transfer_s=moved.transfer_s, transfer_bytes=moved.bytes, stall_s=moved.stall_s,
            start_stall_s=moved.start_stall_s,
            link_idle=moved.idle_s / elapsed if elapsed > 0 else 0.0,
            finished=token in self.stop_ids or max_tokens == 1,
        )

    def iterate(self, seq: list[int], target_cache: DynamicCache, draft_cache: DynamicCache,
                sampling: SamplingParams, max_tokens: int) -> IterationEvent:
        """One iteration: under --budget auto the sizer first chooses between drafting and the
        target alone, unless a predicted output goes on from here (its chain is scored whatever
        the draft's rates, and its acceptance, not the draft's, is not recorded); `seq` grows by
        the emitted tokens."""
        sizer = self.shape.sizer
        if sizer is None or (sampling.prediction is not None and sampling.prediction.chain(1)):
            return self.draft_and_verify(seq, target_cache, draft_cache, sampling, max_tokens)[0]
        choice = sizer.choose(len(seq) - cache_length(draft_cache))
        if choice.draft:
            event, done = self.draft_and_verify(seq, target_cache, draft_cache, sampling, max_tokens)
            sizer.record(Observed(
                tokens=len(event.token_ids), target_s=event.target_s, draft_s=event.draft_s, catch_up=done.catch_up,
                catch_up_s=done.catch_up_s, widths=done.grown.widths, size=done.grown.tree.size,
                predicted=done.grown.predicted, accepted=event.accepted))
        else:
            event = self.target_alone(seq, target_cache, sampling, max_tokens)
            sizer.record(Observed(tokens=1, target_s=event.target_s))
        drafting = LOOK if choice.look else DRAFTED if choice.draft else ALONE
        return replace(event, drafting=drafting, rate_with_tree=choice.with_tree, rate_alone=choice.alone)

    def draft_and_verify(self, seq: list[int], target_cache: DynamicCache, draft_cache: DynamicCache,
                         sampling: SamplingParams, max_tokens: int) -> tuple[IterationEvent, Iteration]:
        """One iteration of SpecExec's loop with this engine's strategy (specexec.py), and its event."""
        captured = self.draft.graphs_captured()
        done = iterate(self.strategy, self.target, self.draft, (target_cache, draft_cache), seq, self.shape, sampling,
                       max_tokens, self.stop_ids)
        moved = self.take_transfer()  # after the synchronize: every wait of the pass is counted
        grown, verdict, wall = done.grown, done.verdict, done.wall_s
        calibrated = self.shape.sizer.calibration.acceptance * grown.predicted if self.shape.sizer else 0.0
        event = IterationEvent(
            token_ids=verdict.tokens, accepted=verdict.accepted,
            tree_size=grown.tree.size, depth=grown.tree.depth,
            draft_s=done.draft_s, target_s=wall - done.draft_s,  # the pass, the walk, the pruning
            pass_s=done.pass_s,
            transfer_s=moved.transfer_s, transfer_bytes=moved.bytes, stall_s=moved.stall_s,
            start_stall_s=moved.start_stall_s,
            link_idle=moved.idle_s / wall if wall > 0 else 0.0,
            finished=verdict.stopped or len(verdict.tokens) >= max_tokens,
            draft_steps=1 + grown.steps,  # the catch-up forward gave the root's logits
            tree_host_s=grown.host_s,
            graphs_captured=self.draft.graphs_captured() - captured,
            predicted_accepted=calibrated,
        )
        return event, done

    def take_transfer(self) -> TransferStats:
        """What the link did since the last event took its share: the events of a reply add up
        to every byte streamed, including what was staged between two of them."""
        now = self.target.transfer_stats()
        moved, self.transfer_mark = now - self.transfer_mark, now
        return moved
