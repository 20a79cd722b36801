"""The draft tree as flat tensors: its limits (`TreeShape`), its nodes while it grows
(`NodeStore`) and the grown tree (`DraftTree`, with the draft's books in `GrownTree`).

Node 0 is the root: the last committed token, whose children are candidates for the next
position. In a grown tree parents always precede their children, so a node's index is also its
slot in the target's KV cache during the tree pass, and masks and pruning are index operations.

A growing tree's books (`NodeStore`, `rank`) are numpy arrays, the grown tree torch tensors: a
tree step's bookkeeping is ~150 small array operations, each ~1 us in numpy where a torch CPU op
costs 3-8 us, and on a GPU the device waits for them between the draft's steps.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from specchat.decoding.autosize import AutoSizer


@dataclass(frozen=True)
class TreeShape:
    """Limits of the draft tree."""

    budget: int  # K: draft tokens in the tree (the root is not counted)
    max_depth: int = 24  # D: deepest node, counted from the root
    # B: nodes expanded per draft forward; None = max(16, K // 8). The embedded pair's real trees at
    # K = 1024 (greedy, 3 MT-Bench first turns, 2026-11-30) emitted the same tokens a tree at B = 256,
    # 128 and 64, over 18.7, 19.2 and 22.7 forwards of 2083, 1440 and 1114 rows: K // 8 runs 31% fewer
    # rows than the paper's K // 4 for half a step more, which a CPU pays by the row and a GPU by the step.
    batch: int | None = None
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
        return self.batch if self.batch is not None else max(16, self.budget // 8)


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
        return list(self.descend_likeliest(start))

    def descend_likeliest(self, start: int) -> Iterator[int]:
        """`likeliest_path`'s nodes one at a time, for a caller that may need only its first few."""
        node = start
        yield node
        while self.children[node]:
            node = max(self.children[node].values(), key=lambda child: float(self.logprobs[child]))
            yield node


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
    """Every node created this iteration, append-only, as numpy arrays; `kept` indexes the
    current best set."""

    def __init__(self, root_token: int, root_slot: int) -> None:
        self.tokens = np.array([root_token], dtype=np.int64)
        self.parents = np.array([-1], dtype=np.int64)
        self.depths = np.array([0], dtype=np.int64)
        self.logprobs = np.array([0.0], dtype=np.float32)
        self.slots = np.array([root_slot], dtype=np.int64)
        self.kept = np.empty(0, dtype=np.int64)
        # Each node the draft ran this iteration, in the order of their slots after the committed
        # prefix: the draft slots of its ancestors and its own, at index depth - 1, 0 past its
        # depth (slot 0, in the committed prefix, is seen by every node anyway). `ran` rows are in
        # use, in a buffer that doubles as it fills (a row from the start: the root's children read
        # one, then drop what they read).
        self.lineage = np.zeros((1, 1), dtype=np.int64)
        self.ran = 0

    @property
    def count(self) -> int:
        return self.tokens.size

    def append(self, tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray,
               logprobs: np.ndarray) -> np.ndarray:
        """Add nodes; return their indices."""
        start = self.count
        self.tokens = np.concatenate([self.tokens, tokens])
        self.parents = np.concatenate([self.parents, parents])
        self.depths = np.concatenate([self.depths, depths])
        self.logprobs = np.concatenate([self.logprobs, logprobs.astype(np.float32, copy=False)])
        self.slots = np.concatenate([self.slots, np.full(tokens.size, -1, dtype=np.int64)])
        return np.arange(start, self.count)

    def run(self, nodes: np.ndarray, committed: int, send: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Give `nodes` the draft-cache slots after those the draft ran this iteration (the
        committed prefix fills [0, committed)) and return what their step attends to, on the device
        `send` moves host tensors to (the draft's: CausalLM.send): bool [b, committed + ran + b],
        each node the committed prefix, its ancestors' slots and its own. A node's lineage is its
        parent's and its own slot: a few array operations a step, however deep the tree (walking up
        the ancestors took a few a level). The mask is made where the step reads it from the
        lineages, [b, depth]: at budget 2048 it is ~6 MB a step, which a GPU's host would otherwise
        fill and copy over."""
        b, ran = nodes.size, self.ran
        depths = self.depths[nodes]
        self.widen(int(depths.max()))
        parent_rows = self.slots[self.parents[nodes]] - committed  # -1: the root, the prefix's last slot
        lineage = self.lineage[np.maximum(parent_rows, 0)] * (parent_rows >= 0)[:, None]
        rows = np.arange(b)
        slots = committed + ran + rows
        lineage[rows, depths - 1] = slots
        self.remember(lineage)
        self.slots[nodes] = slots
        lineages = send(torch.from_numpy(lineage))
        mask = torch.zeros(b, committed + ran + b, dtype=torch.bool, device=lineages.device)
        mask[:, :committed] = True
        return mask.scatter_(1, lineages, True)

    def widen(self, depth: int) -> None:
        """Room in each lineage for `depth` slots."""
        if depth > self.lineage.shape[1]:
            wider = np.zeros((self.lineage.shape[0], depth), dtype=np.int64)
            wider[:, : self.lineage.shape[1]] = self.lineage
            self.lineage = wider

    def remember(self, lineage: np.ndarray) -> None:
        """Append the lineages of the nodes just run."""
        ran = self.ran + lineage.shape[0]
        if ran > self.lineage.shape[0]:
            grown = np.zeros((2 * ran, self.lineage.shape[1]), dtype=np.int64)
            grown[: self.ran] = self.lineage[: self.ran]
            self.lineage = grown
        self.lineage[self.ran: ran] = lineage
        self.ran = ran


# Depths are at most limits.DEPTH's 256: a key's depth field of 16 bits holds any of them.
DEPTH_FIELD = 1 << 16


def rank(logprobs: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """Order by log-prob descending, then depth ascending (parents before equal children), then
    index: one stable sort of an integer key (two stable sorts, the second of floats, took ~6x
    as long on a CPU: ~1 ms for a 10k-node pool, several a tree step at budget 2048)."""
    return np.argsort(rank_key(logprobs, depths), kind="stable")


def rank_key(logprobs: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """int64 keys ordering as `rank` does. A float32's bits read as an int32 order like the float
    where it is positive; a negative's magnitude bits flipped make negatives order too (IEEE 754
    is sign and magnitude). Adding 0.0 first turns -0.0 into 0.0, which it equals."""
    if logprobs.dtype != np.float32:  # a float64's bits would be read as two int32s
        raise TypeError(f"tree log-probs are float32, not {logprobs.dtype}")
    bits = (logprobs + np.float32(0.0)).view(np.int32)
    ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).astype(np.int64)
    return -ordered * DEPTH_FIELD + depths


def add_chain(store: NodeStore, chain: tuple[int, ...], budget: int) -> None:
    """`chain` as a path below the root among the kept nodes: through those that hold its tokens
    already, then new nodes the draft never ran, each ranked as the last node it follows (so the
    walk's rows computed up front follow the chain). Where the tree would pass `budget`, the
    lowest-ranked draft nodes off the chain make room: they are leaves, since a parent outranks
    its children."""
    kept = store.kept
    below = {(parent, token): node for node, parent, token in
             zip(kept.tolist(), store.parents[kept].tolist(), store.tokens[kept].tolist())}
    node, on_chain = 0, []
    for token in chain:
        if (child := below.get((node, token))) is None:
            break
        on_chain.append(node := child)
    rest = chain[len(on_chain):]
    if not rest:
        return
    last = on_chain[-1] if on_chain else 0
    over = kept.size + len(rest) - budget
    if over > 0:
        others = kept[~np.isin(kept, on_chain)]
        kept = np.setdiff1d(kept, others[rank(store.logprobs[others], store.depths[others])][-over:])
    parents = np.array([last, *range(store.count, store.count + len(rest) - 1)], dtype=np.int64)
    depths = store.depths[last] + 1 + np.arange(len(rest), dtype=np.int64)
    added = store.append(np.array(rest, dtype=np.int64), parents, depths, np.full(len(rest), store.logprobs[last]))
    store.kept = np.concatenate([kept, added])


def node_paths(store: NodeStore, nodes: np.ndarray) -> list[list[int]]:
    """Each node's tokens below the root, the root's child first (what a guide consumes to reach it)."""
    tokens, parents = store.tokens.tolist(), store.parents.tolist()
    paths = []
    for node in nodes.tolist():
        path = []
        while node > 0:
            path.append(tokens[node])
            node = parents[node]
        paths.append(path[::-1])
    return paths


def assemble(store: NodeStore, steps: int) -> GrownTree:
    """Root + kept nodes, ordered by depth then log-prob so parents precede children."""
    kept = store.kept[rank(store.logprobs[store.kept], store.depths[store.kept])]
    kept = kept[np.argsort(store.depths[kept], kind="stable")]
    nodes = np.concatenate([np.zeros(1, dtype=np.int64), kept])
    new_index = np.full(store.count, -1, dtype=np.int64)
    new_index[nodes] = np.arange(nodes.size)
    parents = store.parents[nodes]
    parents = np.where(parents >= 0, new_index[np.maximum(parents, 0)], parents)
    return GrownTree(tree=store_tree(store, nodes, parents), draft_slots=torch.from_numpy(store.slots[nodes]),
                     steps=steps)


def store_tree(store: NodeStore, nodes: np.ndarray, parents: np.ndarray) -> DraftTree:
    """The tree of the store's `nodes`, in that order, with their `parents` as indices into it."""
    return DraftTree(tokens=torch.from_numpy(store.tokens[nodes]), parents=torch.from_numpy(parents),
                     depths=torch.from_numpy(store.depths[nodes]), logprobs=torch.from_numpy(store.logprobs[nodes]))
