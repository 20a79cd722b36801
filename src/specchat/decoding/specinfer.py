"""The SpecInfer engine (Miao et al. 2023), SpecExec's baseline: i.i.d. draft stems merged into a
token tree, one target pass over the tree, multi-step speculative sampling down the tree.

Budget rule: K draft tokens are split into S = K // L stems of length L = min(D, isqrt(K)), so
the tree never has more than S * L <= K nodes whatever the samples (merging shared prefixes only
shrinks it; cutting stems by what they sampled would bias the candidates). A stem is accepted to
depth d with probability decaying geometrically in d, while more stems raise the chance that some
candidate is accepted at each node; the square split balances the two (K=16: 4 x 4, K=64: 8 x 8,
K=256: 16 x 16). At temperature 0 every stem would be the draft's argmax chain, so the whole
budget goes to one stem of length min(D, K), the greedy chain.

The engine shares SpecExec's state and cache handling (models, live tree shape, prefill,
draft-cache pruning) and its cache invariants: between iterations the target cache holds the
committed sequence but its last token (the next root), the draft cache a prefix of it.
"""

import math
from collections.abc import Callable, Collection
from time import perf_counter

import torch
from transformers import DynamicCache

from specchat.decoding.events import IterationEvent, SamplingParams
from specchat.decoding.kvcache import cache_length, keep_slots
from specchat.decoding.specexec import NodeLogits, SpecExecEngine
from specchat.decoding.speculative_sampling import distribution, emit, first_accepted
from specchat.decoding.stems import StemLayout, Stems, draft_stems
from specchat.decoding.verifier import Verdict


class SpecInferEngine(SpecExecEngine):
    name = "specinfer"

    def layout(self, temperature: float) -> StemLayout:
        """The module docstring's rule, read from the live tree shape."""
        budget, max_depth = self.shape.budget, self.shape.max_depth
        if temperature == 0:
            return StemLayout(stems=1, length=min(max_depth, budget))
        length = min(max_depth, math.isqrt(budget))
        return StemLayout(stems=budget // length, length=length)

    def iterate(self, seq: list[int], target_cache: DynamicCache, draft_cache: DynamicCache,
                sampling: SamplingParams, max_tokens: int) -> IterationEvent:
        """Draft, score and verify once; `seq` grows by the emitted tokens, both caches are
        pruned to the accepted path."""
        start, moved = perf_counter(), self.target.transfer_stats()
        cached = cache_length(draft_cache)
        layout = self.layout(sampling.temperature)
        stems = draft_stems(self.draft, draft_cache, torch.tensor(seq[cached:]), cached, layout, sampling)
        drafted = perf_counter()
        verdict = self.score_and_walk(stems, seq, target_cache, sampling, max_tokens)
        verified = perf_counter()
        self.prune_draft_cache(draft_cache, stems.grown, verdict, len(seq))
        seq.extend(verdict.tokens)
        moved = self.target.transfer_stats() - moved
        return IterationEvent(
            token_ids=verdict.tokens, accepted=verdict.accepted,
            tree_size=stems.grown.tree.size, depth=stems.grown.tree.depth,
            draft_s=drafted - start, target_s=verified - drafted,
            transfer_s=moved.transfer_s, transfer_bytes=moved.bytes, stall_s=moved.stall_s,
            finished=verdict.stopped or len(verdict.tokens) >= max_tokens,
            draft_steps=stems.grown.steps,
        )

    def score_and_walk(
        self, stems: Stems, seq: list[int], cache: DynamicCache, sampling: SamplingParams, max_tokens: int
    ) -> Verdict:
        """One target pass over the stem tree (tree mask, position = prefix + depth), then
        multi-step speculative sampling; the target cache keeps the prefix and accepted path."""
        tree = stems.grown.tree
        prefix = len(seq) - 1
        visible = torch.cat([torch.ones(tree.tokens.numel(), prefix, dtype=torch.bool), tree.ancestor_mask()], 1)
        logits = NodeLogits(self.target, self.target.hidden(tree.tokens, prefix + tree.depths, cache, visible))
        logits.compute(tree.likeliest_path())
        verdict = walk(stems, logits.of, sampling, len(seq), max_tokens, self.stop_ids)
        keep_slots(cache, torch.cat([torch.arange(prefix), prefix + torch.tensor(verdict.path)]))
        return verdict


def walk(
    stems: Stems,
    target_logits: Callable[[int], torch.Tensor],
    sampling: SamplingParams,
    first_position: int,
    max_tokens: int,
    stop_ids: Collection[int],
) -> Verdict:
    """From the root, test each node's candidates against the target (speculative_sampling.py);
    move to an accepted child, or emit from the residual and stop. The first token emitted is at
    absolute position `first_position`; at most `max_tokens` are emitted."""
    tokens = stems.grown.tree.tokens.tolist()
    path, emitted = [0], []
    while True:
        node, position = path[-1], first_position + len(emitted)
        child, p = choose_child(stems, node, tokens, distribution(target_logits(node), sampling), sampling, position)
        emitted.append(tokens[child] if child is not None else emit(p, sampling.seed, position))
        stopped = emitted[-1] in stop_ids
        if child is None or stopped or len(emitted) >= max_tokens:
            accepted = len(emitted) - (child is None)
            return Verdict(path=path, tokens=emitted, accepted=accepted, stopped=stopped)
        path.append(child)


def choose_child(
    stems: Stems, node: int, tokens: list[int], p: torch.Tensor, sampling: SamplingParams, position: int
) -> tuple[int | None, torch.Tensor]:
    """The accepted candidate child of `node`, or None and the distribution to emit from."""
    candidates = stems.candidates[node]
    if not candidates:  # a leaf: the bonus token comes from p itself
        return None, p
    q = distribution(stems.draft_logits[node], sampling)
    rank, p = first_accepted(p, q, [tokens[child] for child in candidates], sampling.seed, position)
    return (candidates[rank] if rank is not None else None), p
