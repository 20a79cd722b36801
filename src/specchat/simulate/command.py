"""`specchat simulate dsi`: the grid from the command line, its heatmaps and tables, and the points
measured by `specchat bench`.

A measured point comes from the chain-SD rows (engine sd) of a bench results file, one per
(budget K, temperature), summing over its prompts:
  c = draft seconds per drafted token / target seconds per forward
    = (sum draft_s / sum(mean_tree_size * iterations)) / (sum target_s / sum iterations)
    (sd's tree is its chain: mean_tree_size drafts per iteration);
  a = the solution of sum_{i=0..k} a^i = gen_rate, with gen_rate = sum new_tokens / sum iterations
    and k = min(K, max_depth), sd's chain length: under the i.i.d. model an iteration emits
    min(G, k) + 1 tokens, G geometric with P(G >= i) = a^i, whose mean is that sum. Iterations cut
    short by the token limit or a stop token bias a slightly low.
"""

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specchat.bench.results import read_rows
from specchat.errors import SpecchatError
from specchat.paths import make_output_dir
from specchat.simulate.dsi import Grid, Latencies, acceptance_from_gen_rate

GRID_FILE = "dsi_grid.csv"
SUMMARY_FILE = "dsi_summary.md"
LIMITS = {"--lookahead": 64, "--steps": 100, "--tokens": 10_000, "--seeds": 100}  # keeps a run to seconds
BENCH_FIELDS = ("budget", "temperature", "max_depth", "draft_s", "target_s", "iterations", "new_tokens",
                "mean_tree_size")


@dataclass(frozen=True)
class MeasuredPoint:
    """A (c, a) measured by specchat bench."""

    label: str
    drafter_latency: float
    acceptance: float


def parse_range(text: str, flag: str, steps: int, open_low: bool) -> np.ndarray:
    """'LO..HI' as `steps` evenly spaced values (one if LO == HI), or a single number; within
    (0, 1] if `open_low`, else [0, 1]."""
    parts = text.split("..")
    try:
        values = [float(part) for part in parts] if len(parts) <= 2 else []
    except ValueError:
        values = []
    if not values:
        raise SpecchatError(f"{flag} takes LO..HI or one number (got '{text}')")
    low, high = values[0], values[-1]
    if low > high:
        raise SpecchatError(f"{flag} {text}: LO is above HI")
    if not ((0 < low if open_low else 0 <= low) and high <= 1):  # NaN fails both
        raise SpecchatError(f"{flag} must lie in {'(0' if open_low else '[0'}, 1] (got '{text}')")
    return np.linspace(low, high, steps) if low < high else np.array([low])


def check_counts(counts: dict[str, int], servers: int | None) -> None:
    for flag, value in counts.items():
        if not 1 <= value <= LIMITS[flag]:
            raise SpecchatError(f"{flag} must be between 1 and {LIMITS[flag]} (got {value})")
    if servers is not None and servers < 1:
        raise SpecchatError(f"--servers must be >= 1 (got {servers})")


def build_grid(drafter_latency: str, acceptance: str, lookahead: int, servers: int | None, steps: int,
               tokens: int, seeds: int) -> Grid:
    check_counts({"--lookahead": lookahead, "--steps": steps, "--tokens": tokens, "--seeds": seeds}, servers)
    return Grid(
        drafter_latencies=parse_range(drafter_latency, "--drafter-latency", steps, open_low=True),
        acceptances=parse_range(acceptance, "--acceptance", steps, open_low=False),
        lookahead=lookahead, servers=servers, tokens=tokens, seeds=seeds,
    )


def measured_points(path: Path) -> list[MeasuredPoint]:
    """One point per (budget, temperature) of the sd rows of a bench results file."""
    if not path.is_file():
        raise SpecchatError(f"--from-bench {path}: no such file")
    groups: dict[tuple, list[dict]] = {}
    for row in read_rows(path):
        if row.get("engine") == "sd":
            missing = [field for field in BENCH_FIELDS if row.get(field) is None]
            if missing:
                raise SpecchatError(f"--from-bench {path}: an sd row lacks {', '.join(missing)}")
            wrong = [field for field in BENCH_FIELDS if not isinstance(row[field], (int, float))]
            if wrong:
                raise SpecchatError(f"--from-bench {path}: an sd row's {', '.join(wrong)} is not a number")
            groups.setdefault((row["budget"], row["temperature"]), []).append(row)
    if not groups:
        raise SpecchatError(f"--from-bench {path} has no sd rows: run specchat bench --engines sd")
    return [measured_point(budget, temperature, group, path) for (budget, temperature), group in groups.items()]


def measured_point(budget: int, temperature: float, rows: list[dict], path: Path) -> MeasuredPoint:
    label = f"sd K={budget} t={temperature:g}"
    iterations = sum(r["iterations"] for r in rows)
    drafted = sum(r["mean_tree_size"] * r["iterations"] for r in rows)
    draft_s, target_s = sum(r["draft_s"] for r in rows), sum(r["target_s"] for r in rows)
    if min(drafted, target_s) <= 0:
        raise SpecchatError(f"--from-bench {path}: {label} measured no drafts or no target time")
    drafter_latency = (draft_s / drafted) / (target_s / iterations)
    if not 0 < drafter_latency <= 1:
        raise SpecchatError(f"--from-bench {path}: {label} drafts a token in {drafter_latency:.2f} target forwards; "
                            "the simulation needs 0 < c <= 1")
    lookahead = min(budget, rows[0]["max_depth"])
    gen_rate = sum(r["new_tokens"] for r in rows) / iterations
    return MeasuredPoint(label, drafter_latency, acceptance_from_gen_rate(gen_rate, lookahead))


def simulate_point(grid: Grid, point: MeasuredPoint) -> Latencies:
    """The grid's simulation at one (c, a)."""
    return Grid(np.array([point.drafter_latency]), np.array([point.acceptance]), grid.lookahead, grid.servers,
                grid.tokens, grid.seeds).latencies()


def run_dsi(grid: Grid, from_bench: Path | None, out_dir: Path) -> tuple[str, list[Path]]:
    """Simulate the grid (and the measured points), write the tables and heatmaps into `out_dir`;
    returns the markdown summary and the files written."""
    make_output_dir("--out", out_dir)
    points = measured_points(from_bench) if from_bench is not None else []
    latencies = grid.latencies()
    measured = [(point, simulate_point(grid, point)) for point in points]
    from specchat.simulate.heatmaps import write_heatmaps  # matplotlib takes ~0.4 s to import: only here

    summary = render_summary(grid, latencies, measured)
    (out_dir / SUMMARY_FILE).write_text(summary + "\n", encoding="utf-8")
    marks = [(point.label, point.drafter_latency, point.acceptance) for point in points]
    paths = [write_grid_csv(grid, latencies, out_dir / GRID_FILE), out_dir / SUMMARY_FILE,
             *write_heatmaps(grid, latencies, marks, out_dir)]
    return summary, paths


def write_grid_csv(grid: Grid, latencies: Latencies, path: Path) -> Path:
    """One row per cell: c, a and the three latencies in target forwards."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["drafter_latency", "acceptance", "si", "dsi", "non_si"])
        for i, acceptance in enumerate(grid.acceptances):
            for j, drafter_latency in enumerate(grid.drafter_latencies):
                writer.writerow([f"{drafter_latency:.4g}", f"{acceptance:.4g}", f"{latencies.si[i, j]:.4f}",
                                 f"{latencies.dsi[i, j]:.4f}", f"{latencies.non_si[i, j]:.4f}"])
    return path


def describe(grid: Grid) -> str:
    c, a = grid.drafter_latencies, grid.acceptances
    enough = " (the default: enough that no verification waits)" if grid.servers is None else ""
    return (f"Lookahead k = {grid.lookahead}, target servers N = {grid.server_count()}{enough}, "
            f"T = {grid.tokens} tokens, mean of {grid.seeds} seeds; "
            f"drafter latency c {c[0]:g}..{c[-1]:g} ({len(c)} values), "
            f"acceptance rate a {a[0]:g}..{a[-1]:g} ({len(a)} values). Latencies in target forwards "
            "(non-SI = T); the model is described in src/specchat/simulate/dsi.py.")


def render_summary(grid: Grid, latencies: Latencies, measured: list[tuple[MeasuredPoint, Latencies]]) -> str:
    lines = ["# DSI offline simulation", "", describe(grid), "",
             "| ratio | min | median | max | cells below 1 |", "|---|---|---|---|---|"]
    for name, values in latencies.ratios().items():
        below = int((values < 1).sum())
        lines.append(f"| {name} | {values.min():.3f} | {np.median(values):.3f} | {values.max():.3f} "
                     f"| {below} / {values.size} |")
    if measured:
        lines += ["", "Measured by specchat bench (chain SD rows):", "",
                  "| point | c | a | SI | DSI | non-SI | DSI / SI | DSI / non-SI |",
                  "|---|---|---|---|---|---|---|---|"]
        for point, at in measured:
            si, dsi, non_si = at.si.item(), at.dsi.item(), at.non_si.item()
            lines.append(f"| {point.label} | {point.drafter_latency:.3f} | {point.acceptance:.3f} | {si:.2f} "
                         f"| {dsi:.2f} | {non_si:.0f} | {dsi / si:.3f} | {dsi / non_si:.3f} |")
    return "\n".join(lines)
