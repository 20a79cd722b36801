"""The DSI paper's Figure 1: four heatmaps of latency ratios (SI / non-SI, DSI / SI, DSI / non-SI,
DSI / min(SI, non-SI)) over drafter latency x acceptance rate, as small PNGs.

Colours diverge at ratio 1 (blue: the numerator is faster, red: slower) on a log scale symmetric
about 1: r and 1 / r get opposite colours of the same strength, up to the map's largest
max(r, 1 / r). A black line follows ratio 1 where a map crosses it; measured points are crosses.
Figures are drawn on matplotlib's Agg canvas directly, not through pyplot.
"""

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FormatStrFormatter

from specchat.simulate.dsi import Grid, Latencies

FILES = {
    "SI / non-SI": "si_over_non_si.png",
    "DSI / SI": "dsi_over_si.png",
    "DSI / non-SI": "dsi_over_non_si.png",
    "DSI / min(SI, non-SI)": "dsi_over_best.png",
}
INCHES = (5, 4)
DPI = 100
MIN_SPREAD = 1.01  # the colour scale spans at least [1 / this, this]
TICKS = [2.0**e for e in range(-8, 9)]  # ratios 1/256 .. 256 labelled on the colour bar

Mark = tuple[str, float, float]  # a label, its drafter latency c and its acceptance rate a


def write_heatmaps(grid: Grid, latencies: Latencies, marks: list[Mark], out_dir: Path) -> list[Path]:
    """Draw the four heatmaps into `out_dir`; returns the files written."""
    paths = []
    for name, values in latencies.ratios().items():
        path = out_dir / FILES[name]
        FigureCanvasAgg(heatmap(grid, values, name, marks)).print_png(path)
        paths.append(path)
    return paths


def heatmap(grid: Grid, values: np.ndarray, name: str, marks: list[Mark]) -> Figure:
    figure = Figure(figsize=INCHES, dpi=DPI, layout="constrained")
    panel = figure.subplots()
    spread = max(values.max(), 1 / values.min(), MIN_SPREAD)
    mesh = panel.pcolormesh(grid.drafter_latencies, grid.acceptances, values, shading="nearest", cmap="RdBu_r",
                            norm=LogNorm(vmin=1 / spread, vmax=spread))
    if min(values.shape) >= 2 and values.min() < 1 < values.max():
        panel.contour(grid.drafter_latencies, grid.acceptances, values, levels=[1.0], colors="black", linewidths=0.8)
    bar = figure.colorbar(mesh, ax=panel, label=f"latency {name}")
    bar.ax.yaxis.set_major_locator(FixedLocator(TICKS))
    bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    bar.ax.yaxis.set_minor_locator(FixedLocator([]))
    for label, drafter_latency, acceptance in marks:
        panel.scatter([drafter_latency], [acceptance], marker="x", color="black")
        panel.annotate(label, (drafter_latency, acceptance), textcoords="offset points", xytext=(4, 4),
                       fontsize="small")
    panel.set(xlabel="drafter latency c (target forwards per draft)", ylabel="acceptance rate a")
    panel.set_title(f"{name}  (k={grid.lookahead}, N={grid.server_count()}, T={grid.tokens})", fontsize="medium")
    return figure
