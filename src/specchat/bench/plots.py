"""The figures of a sweep, as small PNGs: gen rate and tokens/s against the budget (the SpecExec
paper's Fig. 3 and Fig. 7), and target time per pass against the tokens it scores (Fig. 1, right).

Figures are drawn on matplotlib's Agg canvas directly, not through pyplot: no display is needed
and no global figure state is kept.
"""

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from specchat.bench.report import Configuration, configurations
from specchat.decoding.events import AUTO

PANEL_INCHES = (6, 4)
DPI = 100


def write_plots(rows: list[dict], out_dir: Path) -> list[Path]:
    """Draw the sweep's figures into `out_dir`; returns the files written."""
    entries = configurations(rows)
    figures = {
        "gen_rate_vs_budget.png": budget_figure(entries, "gen_rate", "generation rate (tokens / target pass)"),
        "tokens_per_s_vs_budget.png": budget_figure(entries, "tokens_per_s", "tokens / s"),
        "target_time_vs_tokens.png": target_time_figure(entries),
    }
    paths = []
    for name, figure in figures.items():
        path = out_dir / name
        FigureCanvasAgg(figure).print_png(path)
        paths.append(path)
    return paths


def engine_colors(entries: list[Configuration]) -> dict[str, str]:
    """One colour per engine (matplotlib's "CN" cycle), the same in every panel and figure."""
    return {engine: f"C{i % 10}" for i, engine in enumerate(dict.fromkeys(e.engine for e in entries))}


def budget_figure(entries: list[Configuration], metric: str, label: str) -> Figure:
    """One panel per temperature, one line per engine; an engine with no budget is a dashed level,
    and specexec at --budget auto a dotted one."""
    temperatures = sorted({e.temperature for e in entries}, reverse=True)
    width = max(PANEL_INCHES[0], 4 * len(temperatures))
    figure = Figure(figsize=(width, PANEL_INCHES[1]), dpi=DPI, layout="constrained")
    axes = figure.subplots(1, len(temperatures), squeeze=False, sharey=True)[0]
    for panel, temperature in zip(axes, temperatures):
        draw_engines(panel, [e for e in entries if e.temperature == temperature], metric, engine_colors(entries))
        panel.set(title=f"temperature {temperature:g}", xlabel="budget K (draft tokens per tree)", ylabel=label)
        finish(panel)
        panel.set_xticks(sorted({e.budget for e in entries if isinstance(e.budget, int)}))
    return figure


def draw_engines(panel: Axes, entries: list[Configuration], metric: str, colors: dict[str, str]) -> None:
    for engine, color in colors.items():
        points = [(e.budget, getattr(e, metric)) for e in entries if e.engine == engine]
        points = [(budget, value) for budget, value in points if value is not None]
        sized = [(budget, value) for budget, value in points if isinstance(budget, int)]
        if sized:
            panel.plot(*zip(*sorted(sized)), marker="o", label=engine, color=color)
        for budget, value in points:
            if budget is None:  # e.g. autoregressive; hf-assisted has no gen rate, so no point
                panel.axhline(value, linestyle="--", linewidth=1, label=engine, color=color)
            elif budget == AUTO:
                panel.axhline(value, linestyle=":", linewidth=1.5, label=f"{engine} auto", color=color)


def target_time_figure(entries: list[Configuration]) -> Figure:
    """Target time per pass against the tokens it scores (tree + root): one point per configuration."""
    figure = Figure(figsize=PANEL_INCHES, dpi=DPI, layout="constrained")
    panel = figure.subplots()
    for engine, color in engine_colors(entries).items():
        points = [(e.tree_size + 1, e.target_ms) for e in entries
                  if e.engine == engine and e.tree_size is not None and e.target_ms is not None]
        if points:
            panel.scatter(*zip(*points), label=engine, color=color)
    panel.set(xlabel="tokens scored per target pass (tree + 1)", ylabel="target ms per pass",
              title="target forward time")
    finish(panel)
    return figure


def finish(panel: Axes) -> None:
    panel.set_xscale("log", base=2)
    panel.xaxis.set_major_formatter(FormatStrFormatter("%g"))  # 256, not 2^8
    panel.grid(alpha=0.3)
    if panel.get_legend_handles_labels()[0]:
        panel.legend(fontsize="small")
