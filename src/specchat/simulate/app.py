"""The `specchat simulate` command group; `specchat.cli` mounts it under `simulate`."""

import sys
from pathlib import Path

import typer

from specchat.paths import output_path
from specchat.simulate.command import build_grid, run_dsi

simulate_app = typer.Typer(
    help="Offline simulations of speculative inference (no models): latencies in target forwards.",
    add_completion=False,
    rich_markup_mode=None,
)


@simulate_app.command("dsi")
def simulate_dsi(
    out: str = typer.Option(..., help="Directory of the heatmaps (PNG), dsi_grid.csv and dsi_summary.md."),
    drafter_latency: str = typer.Option("0.01..1", help="LO..HI or one number in (0, 1]: target forwards per draft."),
    acceptance: str = typer.Option("0..1", help="LO..HI or one number in [0, 1]: each draft's acceptance probability."),
    lookahead: int = typer.Option(5, help="Drafts k per verification (SI's and DSI's)."),
    servers: int = typer.Option(None, help="Target servers N of DSI (default: enough that no verification waits, "
                                "max(ceil(1 / (k c_min)), 2))."),
    steps: int = typer.Option(20, help="Values per LO..HI range."),
    tokens: int = typer.Option(100, help="Tokens T generated per simulated run."),
    seeds: int = typer.Option(5, help="Acceptance sequences (seeds 0..S-1) averaged per cell."),
    from_bench: Path = typer.Option(None, help="A specchat bench results.jsonl: mark the drafter latency and "
                                    "acceptance rate its sd rows measured, and simulate there."),
) -> None:
    """Latency of non-SI, SI and DSI over drafter latency x acceptance rate (the DSI paper's Figure 1)."""
    grid = build_grid(drafter_latency, acceptance, lookahead, servers, steps, tokens, seeds)
    summary, paths = run_dsi(grid, from_bench, output_path("--out", out))
    print(summary)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
