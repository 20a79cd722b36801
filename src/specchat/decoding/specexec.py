"""One SpecExec iteration (Svirschevski et al. 2024), read top to bottom in `iterate`:

1. catch_up: the draft runs the committed tokens its cache lacks; the last one is the tree's root.
2. grow (Algorithm 2, "parallel SSSP"): the K likeliest continuations as a token tree.
3. score: one target pass over the whole tree.
4. walk (Algorithm 1): sample the target at each node, down the tree while it holds the token.
5. prune: both caches keep the committed prefix and the accepted path.

Cache invariant between iterations, for the committed sequence `seq` of length L:
- the target cache holds exactly seq[:L-1]; the tree's root is seq[L-1], so one pass over the
  tree yields the target distribution for position L and for every drafted continuation;
- the draft cache holds some prefix of seq (what it computed on the accepted path); catch_up runs
  the rest before the next tree grows. The prefix is never recomputed.

SpecInfer and chain SD (specinfer.py, chain_sd.py) run this same iteration with their own grow and
walk (a `TreeStrategy`); `TreeEngine` (tree_engine.py) runs iterations into a reply. The shared
pieces are imported: the tree's tensors (tree.py), the target's rows on demand (node_logits.py),
sampling (sampling.py), the caches (kvcache.py) and the models (forward.py).
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Generic, TypeVar

import numpy as np
import torch
from transformers import DynamicCache

from specchat.decoding.autosize import AutoSizer
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length, keep_slots
from specchat.decoding.node_logits import NodeLogits
from specchat.decoding.sampling import emit_token
from specchat.decoding.tree import (DraftTree, GrownTree, NodeStore, TreeShape, add_chain, assemble, node_paths,
                                    rank)
from specchat.device_clock import now
from specchat.stopwatch import Stopwatch
from specchat.tracing import span

Grown = TypeVar("Grown", bound=GrownTree)
NodeRows = Callable[[int], torch.Tensor]  # a tree node -> the target's logits there [V]


@dataclass(frozen=True)
class Root:
    """The last committed token, where a draft tree grows from, once the draft cache holds the
    whole committed sequence."""

    token: int
    slot: int  # its draft-cache slot: the committed sequence fills slots [0, slot]
    position: int  # its absolute position
    hidden: torch.Tensor  # [1, H] the draft's final hidden state at it (its LM head gives the first level)


@dataclass
class Verdict:
    path: list[int]  # tree nodes whose tokens are now committed with a target KV slot, root first
    tokens: list[int]  # tokens emitted this iteration
    accepted: int  # how many emitted tokens were draft tokens found in the tree
    stopped: bool  # a stop token was emitted


@dataclass(frozen=True)
class TreeStrategy(Generic[Grown]):
    """What tells a tree method apart: how its tree grows and how the walk down it decides."""

    name: str  # the engine's name (--engine)
    grow: Callable[[CausalLM, DynamicCache, Root, TreeShape, SamplingParams], Grown]
    walk: Callable[[Grown, NodeRows, SamplingParams, int, int, Collection[int]], Verdict]
    guided: bool  # emits every token through emit_token: keeps a reply's grammar and token log


@dataclass(frozen=True)
class Iteration:
    grown: GrownTree
    verdict: Verdict
    catch_up: int  # committed tokens the draft ran before growing the tree
    catch_up_s: float
    draft_s: float  # the catch-up and the growth
    pass_s: float  # the target's forward over the tree (and its mask)
    wall_s: float  # all of it: the rest after draft_s is the pass, the walk and the pruning


def iterate(strategy: TreeStrategy, target: CausalLM, draft: CausalLM, caches: tuple[DynamicCache, DynamicCache],
            seq: list[int], shape: TreeShape, sampling: SamplingParams, max_tokens: int,
            stop_ids: Collection[int]) -> Iteration:
    """Emit up to `max_tokens` tokens: `seq` grows by them, and the caches (target's, draft's)
    hold the invariant again. Times are the synchronized clock's: one reading per boundary."""
    target_cache, draft_cache = caches
    devices = (target.device, draft.device)
    start, cached, committed = now(*devices), cache_length(draft_cache), len(seq)
    with span("draft"):  # each span ends at a synchronized reading: a trace's span holds its device work
        root = catch_up(draft, draft_cache, torch.tensor(seq[cached:]), cached)  # 1. the root is seq[L-1]
        caught_up_at = now(draft.device)
        grown = strategy.grow(draft, draft_cache, root, shape, sampling)  # 2. SpecExec's: `grow` below
        drafted_at = now(*devices)
    with span("pass"):
        hidden = score(target, target_cache, grown.tree, prefix=committed - 1)  # 3. every node's hidden state
        pass_s = now(target.device) - drafted_at  # the forward (and its mask): the rest is verification
    with span("verify"):
        logits = NodeLogits(target, grown.tree, hidden)  # the LM head's rows, as the walk asks for them
        logits.compute_upfront()
        verdict = strategy.walk(grown, logits.of, sampling, committed, max_tokens, stop_ids)  # 4. from position L
        prune(caches, grown, verdict, committed)  # 5.
    seq.extend(verdict.tokens)
    return Iteration(grown, verdict, catch_up=committed - cached, catch_up_s=caught_up_at - start,
                     draft_s=drafted_at - start, pass_s=pass_s, wall_s=now(*devices) - start)


def catch_up(draft: CausalLM, cache: DynamicCache, pending: torch.Tensor, start_position: int) -> Root:
    """Run the committed tokens the draft cache lacks, `pending` (at least the root, the last
    committed token), from absolute position `start_position`."""
    hidden = draft.hidden(pending, torch.arange(start_position, start_position + pending.numel()), cache)
    position = start_position + pending.numel() - 1
    return Root(int(pending[-1]), cache_length(cache) - 1, position, hidden[-1:])


def grow(draft: CausalLM, cache: DynamicCache, root: Root, shape: TreeShape, sampling: SamplingParams) -> GrownTree:
    """Algorithm 2: the tree grows best-first by cumulative draft log-probability (under the
    temperature actually sampled, and through the tokens a reply's guide allows). Each step runs
    the draft on the B best kept nodes not yet expanded, offers their `max_children` likeliest
    children, and keeps the K (`budget`) best nodes overall. Ties break toward shallower nodes, so
    a parent (log-prob >= its child's) always outranks its child and the kept set is a tree. Growth
    ends when no open kept node beats the threshold T (the K-th best log-prob): its children could
    only score lower. The result: the K best prefixes of depth <= D under the draft, each node
    limited to its `max_children` best children; a step expands no more nodes than the draft's
    cache has room for (StaticDraft.room; growth ends where none is left). Under --budget auto the
    sizer widens each step and cuts the tree where its predicted rate peaks (autosize.py). A
    predicted output's next tokens join last, as a chain (tree.add_chain). The tree's `host_s`: its bookkeeping, the seconds outside the draft's steps (a step ends when its
    top children reach the host, so on a GPU the rest is time the device waits for the host)."""
    temperature, guide = sampling.temperature, sampling.guide
    started, steps = perf_counter(), Stopwatch()  # the draft's steps; the rest of growing is the host's
    committed = root.slot + 1
    store = NodeStore(root.token, root.slot)
    root_allowed = None if guide is None else guide.allowed()
    with steps:
        top = children(draft, root.hidden, shape, temperature, root_allowed)
    add_children(store, np.zeros(1, dtype=np.int64), top, shape)
    widths, spent = [], shape.sizer.draft_s(1) if shape.sizer else 0.0  # the root's step
    while (nodes := next_expansion(store, shape, spent)[: draft.room(cache)]).size > 0:  # the best first
        mask = store.run(nodes, committed, draft.send)  # their slots follow those the draft ran
        tokens = torch.from_numpy(store.tokens[nodes])
        positions = torch.from_numpy(root.position + store.depths[nodes])
        with steps:
            hidden = draft.hidden(tokens, positions, cache, mask)
            allowed = None if guide is None else guide.allowed(node_paths(store, nodes))  # while a GPU runs the step
            top = children(draft, hidden, shape, temperature, allowed)  # its values reach the host: the step is done
        add_children(store, nodes, top, shape)
        widths.append(nodes.size)
        if shape.sizer:
            spent += shape.sizer.draft_s(nodes.size)
            record_branching(shape.sizer, store, nodes)
    predicted = 0.0
    if shape.sizer is not None:
        cut = shape.sizer.best_cut(probs(store, store.kept).sort(descending=True).values, spent)
        store.kept = store.kept[rank(store.logprobs[store.kept], store.depths[store.kept])][: cut.size]
        predicted = cut.predicted
    if sampling.prediction is not None:  # a predicted output's next tokens, as a path below the root
        add_chain(store, sampling.prediction.chain(min(shape.max_depth, shape.budget)), shape.budget)
    grown = assemble(store, len(widths))
    return replace(grown, predicted=predicted, widths=tuple(widths), host_s=perf_counter() - started - steps.seconds)


def children(draft: CausalLM, hidden: torch.Tensor, shape: TreeShape, temperature: float,
             allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `max_children` likeliest next tokens (among those `allowed`, when given) with
    their scores: draft log-probs, or their ranks negated (0, -1, -2, ...) for a ranked tree."""
    values, tokens = draft.top_logprobs(hidden, shape.max_children, temperature, allowed)
    if shape.ranked_tree:  # a child the guide forbids keeps its -inf
        ranks = -torch.arange(values.shape[1], dtype=values.dtype).expand_as(values)
        values = torch.where(torch.isfinite(values), ranks, values)
    return values, tokens


def add_children(store: NodeStore, parents: np.ndarray, top: tuple[torch.Tensor, torch.Tensor],
                 shape: TreeShape) -> None:
    """Offer each parent's best children, `top` = (their log-probs, their tokens) [b, k] on the
    host, under the (temperature-scaled) distribution actually sampled, and keep the `budget`
    best nodes."""
    values, tokens = top[0].numpy(), top[1].numpy()
    cand_logprobs = (store.logprobs[parents][:, None] + values).ravel()  # log P(child) = log P(parent) + log q
    cand_tokens = tokens.ravel()
    cand_parents = np.repeat(parents, tokens.shape[1])
    cand_depths = store.depths[cand_parents] + 1
    finite = np.isfinite(cand_logprobs)
    if not finite.all():  # a child the guide forbids (or the draft's sub-vocabulary never scores)
        cand_logprobs, cand_tokens = cand_logprobs[finite], cand_tokens[finite]
        cand_parents, cand_depths = cand_parents[finite], cand_depths[finite]

    kept = store.kept
    pool_logprobs = np.concatenate([store.logprobs[kept], cand_logprobs])
    pool_depths = np.concatenate([store.depths[kept], cand_depths])
    best = rank(pool_logprobs, pool_depths)[: shape.budget]
    from_kept = best[best < kept.size]
    from_cand = best[best >= kept.size] - kept.size
    added = store.append(
        cand_tokens[from_cand], cand_parents[from_cand], cand_depths[from_cand], cand_logprobs[from_cand]
    )
    store.kept = np.concatenate([kept[from_kept], added])


def next_expansion(store: NodeStore, shape: TreeShape, spent: float) -> np.ndarray:
    """The nodes the next draft step expands: a fixed batch, or as many as the sizer finds pay."""
    nodes = pick_expansion(store, shape)
    if shape.sizer is None or nodes.size == 0:
        return nodes
    kept = probs(store, store.kept).sort(descending=True).values
    return nodes[: shape.sizer.step_width(probs(store, nodes), kept, spent)]


def probs(store: NodeStore, nodes: np.ndarray) -> torch.Tensor:
    """The nodes' draft probabilities, as the sizer weighs them."""
    return torch.from_numpy(store.logprobs[nodes]).exp()


def pick_expansion(store: NodeStore, shape: TreeShape) -> np.ndarray:
    """The B best kept nodes not yet expanded that could still add a node to the top K."""
    kept = store.kept
    open_nodes = kept[(store.slots[kept] < 0) & (store.depths[kept] < shape.max_depth)]
    if open_nodes.size == 0:
        return open_nodes
    if kept.size >= shape.budget:
        # T: the K-th best log-prob; a child never beats its parent, so nodes at or below T
        # cannot contribute.
        threshold = store.logprobs[kept].min()
        open_nodes = open_nodes[store.logprobs[open_nodes] > threshold]
    order = rank(store.logprobs[open_nodes], store.depths[open_nodes])
    return open_nodes[order[: shape.expansion_batch]]


def record_branching(sizer: AutoSizer, store: NodeStore, parents: np.ndarray) -> None:
    """How much of the expanded parents' probability mass their kept children carry."""
    kept_children = store.kept[np.isin(store.parents[store.kept], parents)]
    sizer.calibration.record_expansion(float(probs(store, parents).sum()), float(probs(store, kept_children).sum()))


def score(target: CausalLM, cache: DynamicCache, tree: DraftTree, prefix: int) -> torch.Tensor:
    """One target pass over every tree node, each seeing the `prefix` committed tokens the cache
    holds and its own ancestors, at position prefix + depth: the hidden states [n, H]. The mask is
    made where the pass reads it, the host copying over only the ancestors' [n, n] part (the
    prefix's part, n x prefix, was built on the host and copied: 12.6 MB at 2048 nodes after
    4096 tokens, 12 ms of the host's on a CPU)."""
    n = tree.tokens.numel()
    mask = torch.ones(n, prefix + n, dtype=torch.bool, device=target.device)
    mask[:, prefix:] = tree.ancestor_mask()
    return target.hidden(tree.tokens, prefix + tree.depths, cache, mask)


def walk(grown: GrownTree, node_logits: NodeRows, sampling: SamplingParams, first_position: int,
         max_tokens: int, stop_ids: Collection[int]) -> Verdict:
    """Algorithm 1: at each node emit a sample of the target's distribution there, with the
    uniform of its absolute position (sampling.py), so every token is the one sequential sampling
    emits there; a token the tree holds as a child moves the walk on, any other ends it."""
    tree = grown.tree

    def step(node: int, position: int) -> tuple[int, int | None]:
        token = emit_token(node_logits(node), sampling, position)  # u_n keyed by (seed, n): the tree cannot move it
        return token, tree.children[node].get(token)  # None: a miss, the target's own token

    return descend(step, first_position, max_tokens, stop_ids)


Step = Callable[[int, int], tuple[int, int | None]]  # (node, position) -> (token, child or None)


def descend(step: Step, first_position: int, max_tokens: int, stop_ids: Collection[int]) -> Verdict:
    """The walk every tree method shares: from the root, emit the token `step` gives for each
    node at its absolute position and move to the child it names. The walk ends at a miss (no
    child: the token came from the target alone), at a stop token, or after `max_tokens`
    tokens; every token that names a child is a drafted one, so all but a final miss count as
    accepted."""
    path, tokens = [0], []
    while True:
        token, child = step(path[-1], first_position + len(tokens))
        tokens.append(token)
        stopped = token in stop_ids
        if child is None or stopped or len(tokens) >= max_tokens:
            return Verdict(path=path, tokens=tokens, accepted=len(tokens) - (child is None), stopped=stopped)
        path.append(child)


def prune(caches: tuple[DynamicCache, DynamicCache], grown: GrownTree, verdict: Verdict, committed: int) -> None:
    """The target cache keeps the prefix before the root and the walked path (root first); the
    draft cache the `committed` prefix and the slots of accepted nodes the draft has run."""
    target_cache, draft_cache = caches
    prefix = committed - 1
    keep_slots(target_cache, torch.cat([torch.arange(prefix), prefix + torch.tensor(verdict.path)]))
    slots = grown.draft_slots[torch.tensor(verdict.path[1:], dtype=torch.long)]
    keep_slots(draft_cache, torch.cat([torch.arange(committed), slots[slots >= 0]]))


SPECEXEC = TreeStrategy("specexec", grow=grow, walk=walk, guided=True)  # the tree grows through allowed tokens
