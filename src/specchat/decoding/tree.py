"""The draft tree as flat tensors: its limits (`TreeShape`), its nodes while it grows
(`NodeStore`) and the grown tree (`DraftTree`, with the draft's books in `GrownTree`).

Node 0 is the root: the last committed token, whose children are candidates for the next
position. In a grown tree parents always precede their children, so a node's index is also its
slot in the target's KV cache during the tree pass, and masks and pruning are index operations.
"""

from dataclasses import dataclass
from functools import cached_property

import torch

from specchat.decoding.autosize import AutoSizer


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
class DraftTree:
    tokens: torch.Tensor  # [n] int64 token ids
    parents: torch.Tensor  # [n] int64 parent index, -1 for the root
    depths: torch.Tensor  # [n] int64, root = 0
    logprobs: torch.Tensor  # [n] float32 cumulative draft log-probability, root = 0

    @property
    def size(self) -> int:
        """Number of draft tokens (the root is committed, not drafted)."""
        return self.tokens.numel() - 1

    @property
    def depth(self) -> int:
        return int(self.depths.max())

    def ancestor_mask(self) -> torch.Tensor:
        """bool [n, n]: entry (i, j) is True when j is i itself or one of its ancestors."""
        return ancestor_mask(self.parents, self.depth)

    @cached_property
    def children(self) -> list[dict[int, int]]:
        """For each node, its children keyed by token id."""
        table: list[dict[int, int]] = [{} for _ in range(self.tokens.numel())]
        for child, (parent, token) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            if parent >= 0:
                table[parent][token] = child
        return table

    def likeliest_path(self, start: int = 0) -> list[int]:
        """From `start` (the root by default), repeatedly step to the child with the highest draft
        log-prob."""
        path, node = [start], start
        while self.children[node]:
            node = max(self.children[node].values(), key=lambda child: float(self.logprobs[child]))
            path.append(node)
        return path


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Ancestor-or-self matrix by walking every node up `max_depth` levels at once.

    Parents must be -1 for roots; walking stops at the root for each row.
    """
    n = parents.numel()
    rows = torch.arange(n)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[rows, rows] = True
    current = parents.clone()
    for _ in range(max_depth):
        alive = current >= 0
        if not alive.any():
            break
        mask[rows[alive], current[alive]] = True
        current[alive] = parents[current[alive]]
    return mask


@dataclass
class GrownTree:
    tree: DraftTree
    draft_slots: torch.Tensor  # [n] draft-cache slot of each node, -1 if never run by the draft
    steps: int  # draft forwards spent growing it from the root
    predicted: float = 0.0  # --budget auto: accepted tokens predicted by the draft (uncalibrated)
    widths: tuple[int, ...] = ()  # nodes each of those forwards expanded (SpecExec's trees)
    host_s: float = 0.0  # SpecExec's trees: growing's seconds outside the draft's steps (its bookkeeping)


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
