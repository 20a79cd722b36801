"""The summary of a sweep: per (engine, budget, temperature), means over the prompts."""

from dataclasses import dataclass
from statistics import fmean


@dataclass(frozen=True)
class Configuration:
    engine: str
    budget: int | str | None  # None: an engine that drafts no tree of a chosen size; AUTO: sized per iteration
    temperature: float
    prompts: int
    gen_rate: float | None  # None where the method does not expose it (hf-assisted)
    tokens_per_s: float
    draft_ms: float | None  # per iteration
    target_ms: float | None  # per iteration
    tree_size: float | None  # mean draft tokens scored per target pass
    depth: float | None


def mean(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else fmean(values)


def per_iteration_ms(row: dict, field: str) -> float | None:
    return None if row[field] is None else 1000 * row[field] / row["iterations"]


def configurations(rows: list[dict]) -> list[Configuration]:
    """One entry per (engine, budget, temperature), in the order the rows first name them."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["engine"], row["budget"], row["temperature"]), []).append(row)
    return [
        Configuration(
            engine=engine, budget=budget, temperature=temperature, prompts=len(group),
            gen_rate=mean([r["gen_rate"] for r in group]),
            tokens_per_s=fmean(r["tokens_per_s"] for r in group),
            draft_ms=mean([per_iteration_ms(r, "draft_s") for r in group]),
            target_ms=mean([per_iteration_ms(r, "target_s") for r in group]),
            tree_size=mean([r["mean_tree_size"] for r in group]),
            depth=mean([r["mean_depth"] for r in group]),
        )
        for (engine, budget, temperature), group in groups.items()
    ]


def show(value: float | int | str | None, digits: int) -> str:
    """A figure with `digits` decimals; '-' for None; a word (the budget auto) as it is."""
    if isinstance(value, str):
        return value
    return "-" if value is None else f"{value:.{digits}f}"


def render_table(entries: list[Configuration]) -> str:
    """A markdown table (pastes into docs/benchmarks.md); '-' where a figure does not apply."""
    lines = [
        "| engine | budget K | temperature | prompts | gen rate | tokens/s | draft ms / iter | target ms / iter "
        "| mean tree | mean depth |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in entries:
        lines.append(
            f"| {c.engine} | {show(c.budget, 0)} | {c.temperature:g} | {c.prompts} | {show(c.gen_rate, 2)} "
            f"| {c.tokens_per_s:.2f} | {show(c.draft_ms, 0)} | {show(c.target_ms, 0)} | {show(c.tree_size, 0)} "
            f"| {show(c.depth, 1)} |"
        )
    return "\n".join(lines)


def pool(rows: list[dict]) -> dict:
    """Figures over every iteration of every row, as if one run had generated all the prompts
    (what scripts/bench_gen_rate.py reports): gen rate = sum of new tokens / sum of target passes,
    tokens/s = sum of new tokens / sum of wall time, per-tree means weighted by trees (rows older
    than the "trees" field averaged over every iteration, and are weighted by iterations)."""
    iterations = sum(r["iterations"] for r in rows)
    new_tokens = sum(r["new_tokens"] for r in rows)
    trees = [r.get("trees", r["iterations"]) for r in rows]
    return {
        "gen_rate": new_tokens / iterations,
        "tokens_per_s": new_tokens / sum(r["wall_s"] for r in rows),
        "draft_ms": 1000 * sum(r["draft_s"] for r in rows) / iterations,
        "target_ms": 1000 * sum(r["target_s"] for r in rows) / iterations,
        "tree": sum(r["mean_tree_size"] * n for r, n in zip(rows, trees)) / max(sum(trees), 1),
        "depth": sum(r["mean_depth"] * n for r, n in zip(rows, trees)) / max(sum(trees), 1),
    }
