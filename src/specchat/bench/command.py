"""`specchat bench` end to end: arguments, prompts, models, the sweep."""

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from specchat.bench.datasets import check_dataset, load_prompts
from specchat.bench.pair import engine_options, model_measurer
from specchat.bench.report import configurations, render_table
from specchat.bench.results import RESULTS_FILE
from specchat.bench.runner import HF_ASSISTED, Point, Setup, check_engines, run_sweep
from specchat.decoding.events import AUTO
from specchat.errors import SpecchatError
from specchat.limits import BUDGET, LOOKAHEAD
from specchat.models.spec import resolve
from specchat.loader import load_models, options_for
from specchat.paths import make_output_dir
from specchat.runtime import encode_prompt, validate

Item = TypeVar("Item")


def parse_list(text: str, flag: str, kind: Callable[[str], Item]) -> list[Item]:
    """A comma list, e.g. "16,64,256": items in order, each once."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise SpecchatError(f"{flag} is empty: give a comma list such as {flag} 1,2")
    try:
        return list(dict.fromkeys(kind(item) for item in items))
    except ValueError as error:
        raise SpecchatError(f"{flag} takes a comma list of numbers (got '{text}')") from error


def parse_budget_item(text: str) -> int | str:
    """One item of --budgets: a tree size, or auto."""
    return AUTO if text == AUTO else int(text)


def check_bench(setup: Setup, engines: list[str], budgets: list[int | str], n_prompts: int, compare_hf: bool,
                out_dir: Path) -> None:
    """What can be checked before loading anything, and --out made; one clear line on failure."""
    check_engines(engines)
    sizes = [budget for budget in budgets if budget != AUTO]
    for budget in sizes:
        BUDGET.check("--budgets", budget)
    if "dsi" in engines and (AUTO in budgets or max(sizes) > LOOKAHEAD.high):
        raise SpecchatError(f"dsi takes --budgets as its lookahead: numbers up to {LOOKAHEAD.high:g} "
                            f"(got {','.join(map(str, budgets))})")
    check_dataset(setup.dataset)
    if n_prompts < 1:
        raise SpecchatError(f"--n-prompts must be >= 1 (got {n_prompts})")
    make_output_dir("--out", out_dir)
    options = engine_options(setup)
    for engine in engines:
        validate(options_for(options, engine))
    if compare_hf:
        resolve(setup.draft)


def run_bench(setup: Setup, points: list[Point], n_prompts: int, out_dir: Path, progress: bool = True) -> list[dict]:
    """Load the prompts and the models once, then run the sweep; returns its rows."""
    texts = load_prompts(setup.dataset, n_prompts)
    engines = {point.engine for point in points} - {HF_ASSISTED}
    if HF_ASSISTED in {point.engine for point in points}:
        engines |= {"autoregressive", "specexec"}  # transformers' assisted generation uses the target and draft
    first, *rest = sorted(engines)
    options = replace(engine_options(setup), engine=first, workers=setup.workers if "dsi" in engines else None)
    models = load_models(options, engines=rest, progress=progress)
    try:
        prompts = [encode_prompt(models.tokenizer, text, raw=False) for text in texts]
        return run_sweep(setup, points, prompts, model_measurer(models, setup), out_dir, progress)
    finally:
        models.close()


def report_bench(rows: list[dict], out_dir: Path) -> None:
    """The table on stdout; the plots written beside the results file, each file named on stderr."""
    from specchat.bench.plots import write_plots  # matplotlib takes ~0.4 s to import: only bench needs it

    print(render_table(configurations(rows)))
    for path in [out_dir / RESULTS_FILE, *write_plots(rows, out_dir)]:
        print(f"wrote {path}", file=sys.stderr)
