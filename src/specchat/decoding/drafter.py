"""Draft tree builder: SpecExec's Algorithm 2 (parallel single-source shortest paths).

The tree is grown best-first by cumulative draft log-probability: each step runs the draft on
the B best kept nodes not yet expanded, adds their `max_children` most likely children, and
keeps the `budget` best nodes overall. Ties break toward shallower nodes, so a parent (whose
log-prob is >= its child's) always outranks its child and the kept set is always a tree. The
loop ends when no expandable kept node beats the threshold T (the budget-th best log-prob):
its children could only score lower. The result is exactly the `budget` best prefixes of depth
<= max_depth under the draft's (temperature-scaled) distribution, each node limited to its
`max_children` best children.
"""

from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache

from specchat.decoding.autosize import AutoSizer
from specchat.decoding.forward import CausalLM
from specchat.decoding.guide import Guide
from specchat.decoding.kvcache import cache_length
from specchat.decoding.tree import DraftTree


@dataclass(frozen=True)
class TreeShape:
    """Limits of the draft tree."""

    budget: int  # K: draft tokens in the tree (the root is not counted)
    max_depth: int = 24  # D: deepest node, counted from the root
    batch: int | None = None  # B: nodes expanded per draft forward; None = max(16, K // 4)
    max_children: int = 16  # children taken from one expansion
    sizer: AutoSizer | None = None  # --budget auto: it sizes steps and cuts the tree; budget caps it
    # Measurement only (gpu_check --pair): score the j-th likeliest child of an expansion -j instead
    # of its draft log-prob, so that the first children's chain reaches max_depth and the tree fills
    # its budget whatever the draft's weights (random weights give flat, shallow trees).
    ranked_tree: bool = False

    @property
    def expansion_batch(self) -> int:
        if self.sizer is not None:  # the sizer picks each step's width among all open nodes
            return self.budget
        return self.batch if self.batch is not None else max(16, self.budget // 4)


@dataclass
class GrownTree:
    tree: DraftTree
    draft_slots: torch.Tensor  # [n] draft-cache slot of each node, -1 if never run by the draft
    steps: int  # draft forwards spent growing it from the root
    predicted: float = 0.0  # --budget auto: accepted tokens predicted by the draft (uncalibrated)
    widths: tuple[int, ...] = ()  # nodes each of those forwards expanded (SpecExec's trees)


class NodeStore:
    """Every node created this iteration, append-only; `kept` indexes the current best set."""

    def __init__(self, root_token: int, root_slot: int) -> None:
        self.tokens = torch.tensor([root_token])
        self.parents = torch.tensor([-1])
        self.depths = torch.tensor([0])
        self.logprobs = torch.tensor([0.0])
        self.slots = torch.tensor([root_slot])
        self.kept = torch.empty(0, dtype=torch.long)

    def append(self, tokens, parents, depths, logprobs) -> torch.Tensor:
        """Add nodes; return their indices."""
        start = self.tokens.numel()
        self.tokens = torch.cat([self.tokens, tokens])
        self.parents = torch.cat([self.parents, parents])
        self.depths = torch.cat([self.depths, depths])
        self.logprobs = torch.cat([self.logprobs, logprobs])
        self.slots = torch.cat([self.slots, torch.full_like(tokens, -1)])
        return torch.arange(start, self.tokens.numel())


def rank(logprobs: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """Order by log-prob descending, then depth ascending (parents before equal children)."""
    by_depth = torch.sort(depths, stable=True).indices
    by_logprob = torch.sort(logprobs[by_depth], descending=True, stable=True).indices
    return by_depth[by_logprob]


def add_children(store: NodeStore, parents: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor],
                 shape: TreeShape) -> None:
    """Offer each parent's best children, `top` = (their log-probs, their tokens) [b, k] under
    the (temperature-scaled) distribution actually sampled, and keep the `budget` best nodes."""
    values, tokens = top
    cand_logprobs = (store.logprobs[parents].unsqueeze(1) + values).flatten()
    cand_tokens = tokens.flatten()
    cand_parents = parents.repeat_interleave(tokens.shape[1])
    cand_depths = store.depths[cand_parents] + 1
    finite = torch.isfinite(cand_logprobs)
    cand_logprobs, cand_tokens = cand_logprobs[finite], cand_tokens[finite]
    cand_parents, cand_depths = cand_parents[finite], cand_depths[finite]

    kept = store.kept
    pool_logprobs = torch.cat([store.logprobs[kept], cand_logprobs])
    pool_depths = torch.cat([store.depths[kept], cand_depths])
    best = rank(pool_logprobs, pool_depths)[: shape.budget]
    from_kept = best[best < kept.numel()]
    from_cand = best[best >= kept.numel()] - kept.numel()
    added = store.append(
        cand_tokens[from_cand], cand_parents[from_cand], cand_depths[from_cand], cand_logprobs[from_cand]
    )
    store.kept = torch.cat([kept[from_kept], added])


def pick_expansion(store: NodeStore, shape: TreeShape) -> torch.Tensor:
    """The B best kept nodes not yet expanded that could still add a node to the top K."""
    kept = store.kept
    open_nodes = kept[(store.slots[kept] < 0) & (store.depths[kept] < shape.max_depth)]
    if open_nodes.numel() == 0:
        return open_nodes
    if kept.numel() >= shape.budget:
        # T: the K-th best log-prob; a child never beats its parent, so nodes at or below T
        # cannot contribute.
        threshold = store.logprobs[kept].min()
        open_nodes = open_nodes[store.logprobs[open_nodes] > threshold]
    order = rank(store.logprobs[open_nodes], store.depths[open_nodes])
    return open_nodes[order[: shape.expansion_batch]]


def expansion_mask(store: NodeStore, nodes: torch.Tensor, committed: int, cached: int) -> torch.Tensor:
    """bool [b, cached + b]: each node sees the committed prefix, its ancestors' draft slots
    and itself."""
    b = nodes.numel()
    mask = torch.zeros(b, cached + b, dtype=torch.bool)
    mask[:, :committed] = True
    rows = torch.arange(b)
    mask[rows, cached + rows] = True
    current = store.parents[nodes]
    while True:
        inner = current > 0  # the root's slot lies inside the committed prefix
        if not inner.any():
            break
        mask[rows[inner], store.slots[current[inner]]] = True
        current = torch.where(inner, store.parents[current.clamp(min=0)], current)
    return mask


@dataclass(frozen=True)
class Root:
    """The last committed token, where a draft tree grows from, once the draft cache holds the
    whole committed sequence."""

    token: int
    slot: int  # its draft-cache slot: the committed sequence fills slots [0, slot]
    position: int  # its absolute position
    hidden: torch.Tensor  # [1, H] the draft's final hidden state at it (its LM head gives the first level)


def catch_up(draft: CausalLM, cache: DynamicCache, pending: torch.Tensor, start_position: int) -> Root:
    """Run the committed tokens the draft cache lacks, `pending` (at least the root, the last
    committed token), from absolute position `start_position`."""
    hidden = draft.hidden(pending, torch.arange(start_position, start_position + pending.numel()), cache)
    position = start_position + pending.numel() - 1
    return Root(int(pending[-1]), cache_length(cache) - 1, position, hidden[-1:])


def grow_tree(draft: CausalLM, cache: DynamicCache, root: Root, shape: TreeShape, temperature: float,
              guide: Guide | None = None) -> GrownTree:
    """Build the draft tree from `root`, whose hidden state gives the first level; under a
    reply's `guide`, only through tokens its grammar allows."""
    committed = root.slot + 1
    store = NodeStore(root.token, root.slot)
    root_allowed = None if guide is None else guide.allowed()
    add_children(store, torch.tensor([0]), children(draft, root.hidden, shape, temperature, root_allowed), shape)
    widths, spent = [], shape.sizer.draft_s(1) if shape.sizer else 0.0  # the root's step
    while (nodes := next_expansion(store, shape, spent)).numel() > 0:
        cached = cache_length(cache)
        mask = expansion_mask(store, nodes, committed, cached)
        hidden = draft.hidden(store.tokens[nodes], root.position + store.depths[nodes], cache, mask)
        store.slots[nodes] = torch.arange(cached, cached + nodes.numel())
        allowed = None if guide is None else guide.allowed(node_paths(store, nodes))
        add_children(store, nodes, children(draft, hidden, shape, temperature, allowed), shape)
        widths.append(nodes.numel())
        if shape.sizer:
            spent += shape.sizer.draft_s(nodes.numel())
            record_branching(shape.sizer, store, nodes)
    if shape.sizer is None:
        return replace(assemble(store, len(widths)), widths=tuple(widths))
    cut = shape.sizer.best_cut(store.logprobs[store.kept].exp().sort(descending=True).values, spent)
    store.kept = store.kept[rank(store.logprobs[store.kept], store.depths[store.kept])][: cut.size]
    return replace(assemble(store, len(widths)), predicted=cut.predicted, widths=tuple(widths))


def children(draft: CausalLM, hidden: torch.Tensor, shape: TreeShape, temperature: float,
             allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `max_children` likeliest next tokens (among those `allowed`, when given) with
    their scores: draft log-probs, or their ranks negated (0, -1, -2, ...) for a ranked tree."""
    values, tokens = draft.top_logprobs(hidden, shape.max_children, temperature, allowed)
    if shape.ranked_tree:  # a child the guide forbids keeps its -inf
        ranks = -torch.arange(values.shape[1], dtype=values.dtype).expand_as(values)
        values = torch.where(torch.isfinite(values), ranks, values)
    return values, tokens


def node_paths(store: NodeStore, nodes: torch.Tensor) -> list[list[int]]:
    """Each node's tokens below the root, the root's child first (what a guide consumes to reach it)."""
    paths = []
    for node in nodes.tolist():
        path = []
        while node > 0:
            path.append(int(store.tokens[node]))
            node = int(store.parents[node])
        paths.append(path[::-1])
    return paths


def next_expansion(store: NodeStore, shape: TreeShape, spent: float) -> torch.Tensor:
    """The nodes the next draft step expands: a fixed batch, or as many as the sizer finds pay."""
    nodes = pick_expansion(store, shape)
    if shape.sizer is None or nodes.numel() == 0:
        return nodes
    kept = store.logprobs[store.kept].exp().sort(descending=True).values
    return nodes[: shape.sizer.step_width(store.logprobs[nodes].exp(), kept, spent)]


def record_branching(sizer: AutoSizer, store: NodeStore, parents: torch.Tensor) -> None:
    """How much of the expanded parents' probability mass their kept children carry."""
    kept_children = store.kept[torch.isin(store.parents[store.kept], parents)]
    sizer.calibration.record_expansion(float(store.logprobs[parents].exp().sum()),
                                       float(store.logprobs[kept_children].exp().sum()))


def assemble(store: NodeStore, steps: int) -> GrownTree:
    """Root + kept nodes, ordered by depth then log-prob so parents precede children."""
    kept = store.kept[rank(store.logprobs[store.kept], store.depths[store.kept])]
    kept = kept[torch.sort(store.depths[kept], stable=True).indices]
    nodes = torch.cat([torch.tensor([0]), kept])
    new_index = torch.full((store.tokens.numel(),), -1, dtype=torch.long)
    new_index[nodes] = torch.arange(nodes.numel())
    parents = store.parents[nodes]
    tree = DraftTree(
        tokens=store.tokens[nodes],
        parents=torch.where(parents >= 0, new_index[parents.clamp(min=0)], parents),
        depths=store.depths[nodes],
        logprobs=store.logprobs[nodes],
    )
    return GrownTree(tree=tree, draft_slots=store.slots[nodes], steps=steps)
