"""The tree engines' one loop: draft a token tree, score it with one target pass, walk it, prune.

A `TreeStrategy` supplies the two steps that differ between SpecExec, SpecInfer and chain SD:
how the draft builds the tree, and how the walk down it decides which tokens to emit.
Everything else lives here, once: the masked target pass over the tree, the lazily computed node
logits, both caches' pruning, timing and the `IterationEvent`.

Cache invariant between iterations, for the committed sequence `seq` of length L:
- the target cache holds exactly seq[:L-1]; the tree's root is seq[L-1], so one pass over the
  tree yields the target distribution for position L and for every drafted continuation;
- the draft cache holds some prefix of seq (what it computed on the accepted path); the rest
  is fed as a chain (`catch_up`) before the next tree grows from the root.
Both are pruned to the accepted path after the walk; the prefix is never recomputed.
"""

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import torch
from transformers import DynamicCache

from specchat.decoding.autoregressive import next_token
from specchat.decoding.autosize import AutoSizer, Observed
from specchat.decoding.drafter import GrownTree, Root, TreeShape, catch_up
from specchat.decoding.events import ALONE, AUTO, DRAFTED, LOOK, IterationEvent, LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length, keep_slots
from specchat.decoding.prefix import PrefixCache, Reuse, with_prefill
from specchat.decoding.tree import DraftTree
from specchat.decoding.verifier import Verdict
from specchat.device_clock import now
from specchat.errors import SpecchatError
from specchat.transfer import TransferStats

Drafted = TypeVar("Drafted", bound=GrownTree)


class TreeStrategy(Protocol[Drafted]):
    """How one tree engine drafts and walks; the loop around them is `TreeEngine`'s."""

    guided: bool  # emits every token through emit_token: keeps a reply's grammar and token log

    def draft(self, draft: CausalLM, cache: DynamicCache, root: Root, shape: TreeShape,
              sampling: SamplingParams) -> Drafted:
        """A tree grown from `root` within `shape`; the draft cache holds the committed sequence
        and gains a slot for every node the draft runs."""
        ...

    def walk(self, drafted: Drafted, node_logits: Callable[[int], torch.Tensor], sampling: SamplingParams,
             first_position: int, max_tokens: int, stop_ids: Collection[int]) -> Verdict:
        """Emit up to `max_tokens` tokens down the tree, the first at absolute `first_position`."""
        ...


# Target LM-head rows computed in one batch before the walk. The head reads its whole weight
# matrix (V x H) whatever the row count, so while the product is memory-bound a batch of a few
# rows costs about one row, and every node computed later costs another full read.
UPFRONT_ROWS = 8


@dataclass(frozen=True)
class CatchUp:
    tokens: int  # committed tokens the draft ran before growing the tree
    seconds: float


class NodeLogits:
    """Target logits per tree node, computed on demand.

    The rows the walk will most likely visit (the draft's likeliest path, then the likeliest
    other nodes, up to UPFRONT_ROWS) are computed in one batch up front. A node asked for
    outside them means the walk left that path: it is computed with the likeliest path below it,
    where the walk most likely goes next, in one batch (one read of the head, not one per node).
    """

    def __init__(self, target: CausalLM, tree: DraftTree, hidden: torch.Tensor) -> None:
        self.target = target
        self.tree = tree
        self.hidden = hidden
        self.rows: dict[int, torch.Tensor] = {}

    def compute(self, nodes: list[int]) -> None:
        for node, row in zip(nodes, self.target.logits(self.hidden[nodes])):
            self.rows[node] = row

    def of(self, node: int) -> torch.Tensor:
        if node not in self.rows:
            below = [n for n in self.tree.likeliest_path(node) if n not in self.rows]
            self.compute(below[:UPFRONT_ROWS])
        return self.rows[node]


class TreeEngine:
    """An `Engine` that drafts a tree per target pass, as its strategy says."""

    def __init__(self, name: str, strategy: TreeStrategy, target: CausalLM, draft: CausalLM,
                 stop_ids: Collection[int], shape: TreeShape, sizer: AutoSizer | None = None) -> None:
        """`sizer` makes `--budget auto` available (SpecExec only; without one, auto is not
        honoured and the budget stays as it is); `shape.sizer` set means the engine starts in auto."""
        self.name = name
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
        if (sampling.guide is not None or sampling.token_log is not None) and not self.strategy.guided:
            raise SpecchatError(f"--engine {self.name} cannot keep a reply to a grammar or log its tokens' "
                                "probabilities: use specexec or autoregressive")
        yield from self.history.guard(self.decode(self.history.begin(prompt_ids), max_new_tokens, sampling))

    def forget(self) -> None:
        self.history.forget()

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
        target alone; `seq` grows by the emitted tokens."""
        sizer = self.shape.sizer
        if sizer is None:
            return self.draft_and_verify(seq, target_cache, draft_cache, sampling, max_tokens)[0]
        choice = sizer.choose(len(seq) - cache_length(draft_cache))
        if choice.draft:
            event, grown, caught = self.draft_and_verify(seq, target_cache, draft_cache, sampling, max_tokens)
            sizer.record(Observed(
                tokens=len(event.token_ids), target_s=event.target_s, draft_s=event.draft_s, catch_up=caught.tokens,
                catch_up_s=caught.seconds, widths=grown.widths, size=grown.tree.size, predicted=grown.predicted,
                accepted=event.accepted))
        else:
            event = self.target_alone(seq, target_cache, sampling, max_tokens)
            sizer.record(Observed(tokens=1, target_s=event.target_s))
        drafting = LOOK if choice.look else DRAFTED if choice.draft else ALONE
        return replace(event, drafting=drafting, rate_with_tree=choice.with_tree, rate_alone=choice.alone)

    def draft_and_verify(self, seq: list[int], target_cache: DynamicCache, draft_cache: DynamicCache,
                         sampling: SamplingParams, max_tokens: int) -> tuple[IterationEvent, GrownTree, CatchUp]:
        """Draft, score and walk once; `seq` grows by the emitted tokens, both caches are
        pruned to the accepted path. Also the tree and what the catch-up ran and took."""
        devices = (self.target.device, self.draft.device)
        start, cached = now(*devices), cache_length(draft_cache)
        pending = len(seq) - cached
        root = catch_up(self.draft, draft_cache, torch.tensor(seq[cached:]), cached)
        caught_up_at = now(self.draft.device)
        drafted = self.strategy.draft(self.draft, draft_cache, root, self.shape, sampling)
        drafted_at = now(*devices)
        verdict, pass_s = self.score_and_walk(drafted, seq, target_cache, sampling, max_tokens, drafted_at)
        prune_draft_cache(draft_cache, drafted, verdict, len(seq))
        seq.extend(verdict.tokens)
        wall = now(*devices) - start
        moved = self.take_transfer()  # after the synchronize: every wait of the pass is counted
        calibrated = self.shape.sizer.calibration.acceptance * drafted.predicted if self.shape.sizer else 0.0
        event = IterationEvent(
            token_ids=verdict.tokens, accepted=verdict.accepted,
            tree_size=drafted.tree.size, depth=drafted.tree.depth,
            draft_s=drafted_at - start, target_s=wall - (drafted_at - start),  # the pass, the walk, the pruning
            pass_s=pass_s,
            transfer_s=moved.transfer_s, transfer_bytes=moved.bytes, stall_s=moved.stall_s,
            start_stall_s=moved.start_stall_s,
            link_idle=moved.idle_s / wall if wall > 0 else 0.0,
            finished=verdict.stopped or len(verdict.tokens) >= max_tokens,
            draft_steps=1 + drafted.steps,  # the catch-up forward gave the root's logits
            predicted_accepted=calibrated,
        )
        return event, drafted, CatchUp(pending, caught_up_at - start)

    def take_transfer(self) -> TransferStats:
        """What the link did since the last event took its share: the events of a reply add up
        to every byte streamed, including what was staged between two of them."""
        now = self.target.transfer_stats()
        moved, self.transfer_mark = now - self.transfer_mark, now
        return moved

    def score_and_walk(self, drafted: GrownTree, seq: list[int], cache: DynamicCache, sampling: SamplingParams,
                       max_tokens: int, started: float) -> tuple[Verdict, float]:
        """One target pass over the whole tree (each node sees the committed prefix and its
        ancestors, at position prefix + depth), then the strategy's walk with lazily computed
        logits; the target cache keeps the prefix and the walked path. Also the pass's seconds since
        `started` (the clock's synchronized reading when drafting ended: no second synchronize)."""
        tree = drafted.tree
        prefix = len(seq) - 1
        mask = torch.cat([torch.ones(tree.tokens.numel(), prefix, dtype=torch.bool), tree.ancestor_mask()], 1)
        hidden = self.target.hidden(tree.tokens, prefix + tree.depths, cache, mask)
        pass_s = now(self.target.device) - started  # the forward (and its mask): the rest of target_s is verification
        logits = NodeLogits(self.target, tree, hidden)
        logits.compute(upfront_nodes(tree, UPFRONT_ROWS))
        verdict = self.strategy.walk(drafted, logits.of, sampling, len(seq), max_tokens, self.stop_ids)
        keep_slots(cache, torch.cat([torch.arange(prefix), prefix + torch.tensor(verdict.path)]))
        return verdict, pass_s


def upfront_nodes(tree: DraftTree, rows: int) -> list[int]:
    """The draft's likeliest path (whole, however long), then the nodes of highest cumulative
    draft log-prob not on it, up to `rows` nodes in all."""
    path = tree.likeliest_path()
    on_path = set(path)
    ranked = torch.sort(tree.logprobs, descending=True, stable=True).indices.tolist()
    return path + [node for node in ranked if node not in on_path][: max(0, rows - len(path))]


def prune_draft_cache(cache: DynamicCache, grown: GrownTree, verdict: Verdict, committed: int) -> None:
    """Keep the committed prefix and the draft slots of accepted nodes the draft has run."""
    slots = grown.draft_slots[torch.tensor(verdict.path[1:], dtype=torch.long)]
    keep = torch.cat([torch.arange(committed), slots[slots >= 0]])
    keep_slots(cache, keep)
