"""The benchmark sweep: engines x budgets x temperatures x prompts, one results row per
(prompt, configuration), appended as soon as it is measured and skipped when already there."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from specchat.bench.machine import describe_machine
from specchat.bench.provenance import code_version
from specchat.bench.results import RESULTS_FILE, append_row, read_rows, row_key
from specchat.errors import SpecchatError
from specchat.progress import Reporter
from specchat.decoding.events import AUTO
from specchat.engine_options import DRAFTED_ENGINES, ENGINES

HF_ASSISTED = "hf-assisted"  # transformers' assisted generation, added by --compare-hf

Measure = Callable[[list[int]], dict]  # a prompt's token ids -> its figures under one configuration


@dataclass(frozen=True)
class Setup:
    """What every row of a sweep shares."""

    dataset: str
    max_new_tokens: int
    top_p: float
    seed: int
    target: str
    draft: str
    dtype: str
    offload: str
    max_depth: int
    weights: str = "auto"  # the target's: quantized, dense, auto
    workers: str = "cpu,cpu"  # dsi's target workers
    context: int | None = None  # tokens of KV room; None: the default


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep."""

    engine: str
    budget: int | str | None  # None: the engine drafts no tree of a chosen size, so it runs once; AUTO: sized per iteration
    temperature: float


def check_engines(names: list[str]) -> None:
    unknown = [name for name in names if name not in ENGINES]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise SpecchatError(f"unknown engine{plural} {', '.join(unknown)}: choose among {', '.join(ENGINES)}")


def uses_draft(engine: str) -> bool:
    return engine in DRAFTED_ENGINES or engine == HF_ASSISTED


def budgets_of(engine: str, budgets: list[int | str]) -> list[int | str | None]:
    """The budgets `engine` is swept over: none for an engine without a draft, and auto only for
    specexec, the engine that sizes its own trees."""
    if engine not in DRAFTED_ENGINES:
        return [None]
    return [budget for budget in budgets if budget != AUTO or engine == "specexec"]


def plan_points(engines: list[str], budgets: list[int | str], temperatures: list[float], compare_hf: bool) -> list[Point]:
    """Every configuration, engine by engine; engines with no draft tree are not swept over budgets."""
    names = [*engines, HF_ASSISTED] if compare_hf else engines
    return [
        Point(engine, budget, temperature)
        for engine in names
        for budget in budgets_of(engine, budgets)
        for temperature in temperatures
    ]


def identity(setup: Setup, point: Point, prompt_index: int) -> dict:
    """The fields that say what a row measured (its key, and a little more)."""
    return {
        "engine": point.engine, "budget": point.budget, "temperature": point.temperature, "top_p": setup.top_p,
        "seed": setup.seed, "dataset": setup.dataset, "prompt_index": prompt_index,
        "max_new_tokens": setup.max_new_tokens, "target": setup.target,
        "draft": setup.draft if uses_draft(point.engine) else None, "dtype": setup.dtype, "offload": setup.offload,
        "weights": setup.weights, "max_depth": setup.max_depth if point.engine in DRAFTED_ENGINES else None,
        "workers": setup.workers if point.engine == "dsi" else None,
    }


def run_sweep(setup: Setup, points: list[Point], prompts: list[list[int]], measurer: Callable[[Point], Measure],
              out_dir: Path, progress: bool = True) -> list[dict]:
    """Measure each (configuration, prompt) not yet in `out_dir`/results.jsonl, appending its row at
    once; return the sweep's rows, old and new, in sweep order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_FILE
    rows = {row_key(row): row for row in read_rows(path)}
    version = code_version()
    check_same_code(path, rows.values(), version)
    runs = [(point, index) for point in points for index in range(len(prompts))]
    pending = [(point, index) for point, index in runs if row_key(identity(setup, point, index)) not in rows]
    machine = describe_machine()
    reporter = Reporter(progress)
    if len(pending) < len(runs):  # said aloud: a rerun into a finished folder measures nothing
        reporter.notice(f"{len(runs) - len(pending)} of {len(runs)} runs already in {path}: kept, not measured "
                        "again (a fresh --out measures them anew)")
    if pending:  # one unrecorded run first, so one-time costs (allocations, kernel choice) land in no row
        measurer(pending[0][0])(prompts[pending[0][1]])
    with reporter.bar(total=len(runs), initial=len(runs) - len(pending), desc="bench", unit="run") as bar:
        current, measure = None, None
        for point, index in pending:
            if point != current:
                current, measure = point, measurer(point)
                bar.set_postfix_str(describe(point))
            row = {**identity(setup, point, index), **measure(prompts[index]), "machine": machine, "code": version}
            append_row(path, row)
            rows[row_key(row)] = row
            bar.update()
    return [rows[row_key(identity(setup, point, index))] for point, index in runs]


def check_same_code(path: Path, rows: Iterable[dict], version: str) -> None:
    """A sweep resumes only over rows the same code measured: pooled figures never mix code."""
    others = sorted({str(row.get("code")) for row in rows} - {version})
    if others:
        raise SpecchatError(f"{path} holds rows measured by other code ({', '.join(others)}; this is {version}): "
                            f"measure into a fresh --out folder")


def describe(point: Point) -> str:
    budget = "" if point.budget is None else f" K={point.budget}"
    return f"{point.engine}{budget} t={point.temperature:g}"
