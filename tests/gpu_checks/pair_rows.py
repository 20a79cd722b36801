"""The --pair check's figures per budget, read from `specchat generate --json` (its iterations, its
summary and the plan it ran under), and what they give a user: tokens/s projected at the paper's
generation rates on this card and on a described 24 GB PCIe 4.0 card, every input measured but the
link's speed and the generation rate, both labelled."""

from dataclasses import dataclass

from specchat.doctor.plan import PAPER_GEN_RATES

CARD_LINK_GBPS = 25.0  # a consumer PCIe 4.0 x16 link, pinned (design notes, section 13)


@dataclass(frozen=True)
class BudgetRow:
    """Means over one reply's tree iterations past its warm-up (the prompt's pass drafts none), in seconds."""

    budget: int
    trees: int
    tree_size: float
    depth: float
    draft_steps: float
    draft_s: float  # the draft's catch-up and its tree steps
    pass_s: float  # the target's forward over the tree, streaming included
    stall_s: float  # of which the compute waited for streamed weights
    start_stall_s: float  # of which for the pass's first streamed layer (what drafting left to load)
    streamed: float  # bytes the link moved an iteration
    verify_s: float  # the rest of the target's share: the walk, both caches' pruning
    host_s: float  # the reply's seconds outside drafting and the target, per iteration
    link_gbps: float  # the reply's bytes over the seconds the link was busy
    plan: dict  # generate's: layers by tier, bytes a pass, the draft's form
    tree_host_s: float = 0.0  # of draft_s, the tree's bookkeeping on the host between the draft's steps
    passes_s: tuple[float, ...] = ()  # every tree's pass in turn, those warming up first: a mean hides an outlier
    captured: tuple[bool, ...] = ()  # whether each of those trees captured a draft step's graph

    @property
    def iteration_s(self) -> float:
        return self.draft_s + self.pass_s + self.verify_s + self.host_s

    @property
    def step_ms(self) -> float:
        """The draft's step alone: its forward and top children, the tree's bookkeeping left out."""
        return 1e3 * (self.draft_s - self.tree_host_s) / self.draft_steps if self.draft_steps else 0.0

    @property
    def stream_s(self) -> float:
        """The pass's streaming time at this card's measured link speed."""
        return self.plan["pass_bytes"] / (self.link_gbps * 1e9) if self.link_gbps else 0.0

    @property
    def all_layers_stream_s(self) -> float:
        """Every decoder layer's streaming at this card's link speed, resident ones included (the
        paper pairs' layers are of one size: the pass's bytes a streamed layer times them all).
        Resident layers shorten the pass's streaming, stream_s, where ring slots in their place
        would not: beside it, this is the denominator that does not move with the placement."""
        plan = self.plan
        streamed = plan["ram_layers"] + plan["disk_layers"]
        total = plan["resident_layers"] + streamed
        return self.stream_s * total / streamed if streamed else 0.0

    @property
    def host_share(self) -> float:
        """The host's work, the tree's bookkeeping and the rest outside drafting and the target, of an iteration."""
        return (self.host_s + self.tree_host_s) / self.iteration_s


def budget_row(budget: int, record: dict, warm_trees: int = 0) -> BudgetRow:
    """One budget's row from generate's JSON record: means over its trees after the first
    `warm_trees`, whose first uses of each width compile kernels (Triton), time products (the
    width choices) and capture the draft's step (CUDA graphs, at a width's second use). On the
    first H200 run they lifted the first reply's pass mean to 1.2 s against 0.77 s at budget 2048.
    A later tree that captured a graph is left out too: a capture is a one-time cost (two eager
    warm-ups and the capture), and a shape's second use can come late (the catch-up's one-row
    step is first run by a reply's second tree and captured by its third: ~180 ms more drafting
    in the H200's traced iteration 3 of 2026-11-30, ~1 ms on each step of its row's mean)."""
    events = record["iterations"]
    trees = [e for e in events if e["tree_size"] > 0]
    passes = tuple(e["pass_s"] for e in trees)
    captured = tuple(e["graphs_captured"] > 0 for e in trees)
    trees = [e for index, e in enumerate(trees) if index >= warm_trees and not captured[index]]
    if not trees:
        raise ValueError(f"budget {budget}: the reply drafted {len(passes)} tree(s), none past the {warm_trees} "
                         "warming up that captured no graph")
    summary = record["summary"]
    busy = sum(e["draft_s"] + e["target_s"] for e in events)

    def mean(key: str) -> float:
        return sum(e[key] for e in trees) / len(trees)

    return BudgetRow(budget, len(trees), mean("tree_size"), mean("depth"), mean("draft_steps"), mean("draft_s"),
                     mean("pass_s"), mean("stall_s"), mean("start_stall_s"), mean("transfer_bytes"), mean("target_s") - mean("pass_s"),
                     (summary["wall_s"] - busy) / len(events), summary["transfer_gbps"], record["plan"],
                     mean("tree_host_s"), passes, captured)


def projected_s(row: BudgetRow, card_pass_bytes: float, link_gbps: float) -> float:
    """An iteration on a card whose pass streams `card_pass_bytes` at `link_gbps`: the draft, the
    tree pass bounded by the slower of its compute (measured here) and its streaming there, then
    verification and host work as measured here."""
    compute = row.pass_s - row.stall_s
    return row.draft_s + max(compute, card_pass_bytes / (link_gbps * 1e9)) + row.verify_s + row.host_s


def rates_over(seconds: float) -> str:
    """Tokens/s at the paper's generation rates over iterations of `seconds`."""
    low, high = (rate / seconds for rate in PAPER_GEN_RATES.rates)
    return f"{low:.1f}-{high:.1f}"


def pair_table(rows: list[BudgetRow], card_pass_bytes: float) -> str:
    header = ("| budget | tree (nodes, depth) | draft steps | draft s | tree bookkeeping s | ms a step | pass s "
              "| stall s | at start s | GB streamed "
              "| verify s | host s | iteration s | pass streaming s | tok/s here (projection) "
              f"| tok/s 24 GB PCIe 4 (projection, {CARD_LINK_GBPS:g} GB/s) |")
    lines = [header, "|" + "---|" * 16, *(row_line(r, card_pass_bytes) for r in rows)]
    gen = PAPER_GEN_RATES
    lines.append(f"projections: {gen.rates[0]:g}-{gen.rates[1]:g} tokens a pass ({gen.source}, budgets of 1-2k) "
                 "over the iteration; the 24 GB card's pass streams what doctor plans for it")
    return "\n".join(lines)


def row_line(r: BudgetRow, card_pass_bytes: float) -> str:
    """`r` as a row of pair_table's table."""
    card_s = projected_s(r, card_pass_bytes, CARD_LINK_GBPS)
    return (f"| {r.budget} | {r.tree_size:.0f}, {r.depth:.0f} | {r.draft_steps:.1f} | {r.draft_s:.3f} "
            f"| {r.tree_host_s:.3f} | {r.step_ms:.1f} | {r.pass_s:.3f} | {r.stall_s:.3f} | {r.start_stall_s:.3f} "
            f"| {r.streamed / 1e9:.3f} | {r.verify_s:.3f} | {r.host_s:.3f} | {r.iteration_s:.3f} | {r.stream_s:.3f} "
            f"| {rates_over(r.iteration_s)} | {rates_over(card_s)} |")


def passes_line(row: BudgetRow, warm_trees: int) -> str:
    """Each tree's pass in turn, the warm-up's apart: whether a mean above the streaming is every
    pass or a few (the judged budget's passes read 0.93 s where 2048's read 0.76 on two days); a
    tree past the warm-up that captured a graph, left out of the means, is starred."""
    marked = [f"{s:.3f}" + ("*" if index >= warm_trees and row.captured[index] else "")
              for index, s in enumerate(row.passes_s)]
    warm, rest = " ".join(marked[:warm_trees]), " ".join(marked[warm_trees:])
    line = f"each tree's pass, s: {warm} (warming up) | {rest}" if warm else f"each tree's pass, s: {rest}"
    return line + (" (*: captured a draft step's graph, left out)" if "*" in rest else "")


def plan_line(row: BudgetRow, card_resident: int, card_pass_bytes: float) -> str:
    """The run's placement beside the described card's plan, and why the draft is in its form
    where auto had forms to choose among."""
    plan = row.plan
    why = "".join(f"\n  {note}" for note in plan["notes"] if note.startswith("draft in "))
    return (f"placement: {plan['resident_layers']} resident, {plan['ram_layers']} in RAM, {plan['disk_layers']} on "
            f"disk, {plan['pass_bytes'] / 1e9:.3f} GB a pass planned, {row.streamed / 1e9:.3f} GB streamed an "
            f"iteration, draft in {plan['draft_quant']}; the 24 GB card's plan: {card_resident} resident, "
            f"{card_pass_bytes / 1e9:.2f} GB a pass{why}")
