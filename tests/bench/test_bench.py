"""`specchat bench`: the sweep and its results file, resuming, the summary table, plots, the command."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.cli import assert_one_line_error, run_cli, tiny_dirs  # noqa: F401  (tiny_dirs: model directories)
from helpers.images import png_size
from helpers.tiny import build_tiny, perturbed

from specchat.bench.command import check_bench, parse_budget_item
from specchat.bench.measure import FIGURES, engine_measurer, measure_hf_assisted
from specchat.bench.plots import write_plots
from specchat.bench.report import configurations, pool, render_table
from specchat.bench.results import KEY_FIELDS, RESULTS_FILE, read_rows, row_key
from specchat.bench.provenance import code_version
from specchat.bench.runner import HF_ASSISTED, Point, Setup, check_engines, plan_points, run_sweep
from specchat.decoding.events import AUTO, SamplingParams
from specchat.errors import SpecchatError
from specchat.engine_options import ENGINES
from specchat.runtime import Models

STOP = frozenset({49})
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
SETUP = Setup(dataset="mtbench", max_new_tokens=8, top_p=0.9, seed=0, target="tiny-target", draft="tiny-draft",
              dtype="float64", offload="none", max_depth=8)
POINTS = plan_points(["autoregressive", "specexec"], [4, 16], [0.6, 0.0], compare_hf=False)


@pytest.fixture(scope="module")
def pair():
    target = build_tiny(0)
    return target, perturbed(target, 0.3, seed=1)


@pytest.fixture
def measurer(pair):
    """Engines over the tiny pair; records which (configuration, prompt) ran."""
    target, draft = pair
    models = Models(tokenizer=None, stop_ids=STOP, device=torch.device("cpu"), context=1024, target=target,
                    draft=draft)
    inner = engine_measurer(models, SETUP)
    calls: list[tuple[Point, list[int]]] = []

    def counting(point):
        measure = inner(point)

        def run(prompt_ids):
            calls.append((point, prompt_ids))
            return measure(prompt_ids)
        return run
    counting.calls = calls
    return counting


def sweep(out: Path, measurer) -> list[dict]:
    return run_sweep(SETUP, POINTS, PROMPTS, measurer, out, progress=False)


def lines_of(out: Path) -> list[str]:
    return (out / RESULTS_FILE).read_text().splitlines()


def test_plan_runs_undrafted_engines_once_per_temperature():
    points = plan_points(["specexec", "autoregressive"], [16, 64], [0.6, 0.0], compare_hf=True)
    assert points == [
        Point("specexec", 16, 0.6), Point("specexec", 16, 0.0), Point("specexec", 64, 0.6), Point("specexec", 64, 0.0),
        Point("autoregressive", None, 0.6), Point("autoregressive", None, 0.0),
        Point(HF_ASSISTED, None, 0.6), Point(HF_ASSISTED, None, 0.0),
    ]


def test_unknown_engines_are_listed():
    with pytest.raises(SpecchatError) as raised:
        check_engines(["specexec", "warp", "medusa"])
    assert "warp, medusa" in str(raised.value)
    assert ", ".join(ENGINES) in str(raised.value)


def test_sweep_writes_one_row_per_prompt_and_configuration(tmp_path, measurer):
    rows = sweep(tmp_path, measurer)
    assert len(rows) == len(POINTS) * len(PROMPTS) == 18
    assert [json.loads(line) for line in lines_of(tmp_path)] == rows
    for row in rows:
        assert set(KEY_FIELDS) | set(FIGURES) <= set(row)
        assert row["dataset"] == "mtbench" and row["target"] == "tiny-target" and row["seed"] == 0
        assert 1 <= row["new_tokens"] <= 8
        assert row["gen_rate"] == pytest.approx(row["new_tokens"] / row["iterations"])
        assert row["tokens_per_s"] == pytest.approx(row["new_tokens"] / row["wall_s"])
        assert row["target_s"] > 0 and row["transfer_bytes"] == 0
    autoregressive = [row for row in rows if row["engine"] == "autoregressive"]
    assert len(autoregressive) == 2 * len(PROMPTS)
    assert all(r["budget"] is None and r["draft"] is None and r["gen_rate"] == 1 for r in autoregressive)
    assert all(r["mean_tree_size"] == 0 and r["draft_s"] == 0 for r in autoregressive)
    specexec = [row for row in rows if row["engine"] == "specexec"]
    assert {(r["budget"], r["temperature"]) for r in specexec} == {(4, 0.6), (4, 0.0), (16, 0.6), (16, 0.0)}
    assert all(r["draft"] == "tiny-draft" for r in specexec)
    # the prompt's pass gives the first token and drafts no tree; a reply it ends has none
    assert all(r["trees"] == 0 if r["new_tokens"] == 1 else 0 < r["mean_tree_size"] <= r["budget"] for r in specexec)
    assert sum(r["trees"] for r in specexec) > len(specexec)
    assert max(r["gen_rate"] for r in specexec) > 1  # the tiny draft mostly agrees with its target


def test_rerun_skips_done_rows_and_redoes_a_deleted_one(tmp_path, measurer):
    first = sweep(tmp_path, measurer)
    measurer.calls.clear()
    assert sweep(tmp_path, measurer) == first
    assert measurer.calls == [] and len(lines_of(tmp_path)) == 18

    lines = lines_of(tmp_path)
    removed = json.loads(lines.pop(7))
    (tmp_path / RESULTS_FILE).write_text("\n".join(lines) + "\n")
    again = sweep(tmp_path, measurer)
    assert len(lines_of(tmp_path)) == 18
    redone = [json.loads(line) for line in lines_of(tmp_path)][-1]
    assert row_key(redone) == row_key(removed)
    assert [row_key(r) for r in again] == [row_key(r) for r in first]
    point = Point(removed["engine"], removed["budget"], removed["temperature"])
    # a warm-up run, then the measured one
    assert measurer.calls == [(point, PROMPTS[removed["prompt_index"]])] * 2


def test_a_rerun_says_which_runs_it_kept_unmeasured(tmp_path, measurer, capsys):
    run_sweep(SETUP, POINTS, PROMPTS, measurer, tmp_path, progress=True)
    assert "already in" not in capsys.readouterr().err
    run_sweep(SETUP, POINTS, PROMPTS, measurer, tmp_path, progress=True)
    assert f"18 of 18 runs already in {tmp_path / RESULTS_FILE}: kept, not measured again" in capsys.readouterr().err


def test_truncated_last_line_is_dropped_and_redone(tmp_path, measurer):
    sweep(tmp_path, measurer)
    path = tmp_path / RESULTS_FILE
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # interrupted in the middle of writing the last row
    assert len(read_rows(path)) == 17
    sweep(tmp_path, measurer)
    rows = [json.loads(line) for line in lines_of(tmp_path)]
    assert len(rows) == 18 and len({row_key(r) for r in rows}) == 18


def test_rows_carry_the_code_version_and_other_code_does_not_resume(tmp_path, measurer):
    rows = sweep(tmp_path, measurer)
    assert {row["code"] for row in rows} == {code_version()}
    lines = lines_of(tmp_path)
    (tmp_path / RESULTS_FILE).write_text("\n".join(lines[:-1] + [json.dumps({**json.loads(lines[-1]), "code": "0ld"})]) + "\n")
    with pytest.raises(SpecchatError, match=r"other code \(0ld; this is .*\): measure into a fresh --out folder"):
        sweep(tmp_path, measurer)


def test_a_malformed_middle_line_is_one_clear_error(tmp_path):
    (tmp_path / RESULTS_FILE).write_text('{"engine": "specexec"}\nnot json\n')
    with pytest.raises(SpecchatError, match="line 2 is not a JSON row"):
        read_rows(tmp_path / RESULTS_FILE)


@pytest.mark.parametrize(("content", "fragment"), [(b'{"engine": "sd"}\n[1]\n', "line 2 is not a JSON object"),
                                                 (b'{"engine": "sd"}\n\xff\n', "is not UTF-8 text")])
def test_a_results_file_of_other_rows_is_one_clear_error(tmp_path, content, fragment):
    (tmp_path / RESULTS_FILE).write_bytes(content)  # were AttributeError and UnicodeDecodeError
    with pytest.raises(SpecchatError, match=fragment):
        read_rows(tmp_path / RESULTS_FILE)


def test_the_same_seed_reproduces_gen_rates(tmp_path, measurer):
    first, second = sweep(tmp_path / "a", measurer), sweep(tmp_path / "b", measurer)
    figures = ("new_tokens", "iterations", "gen_rate", "mean_tree_size", "mean_depth")
    assert [[r[f] for f in figures] for r in first] == [[r[f] for f in figures] for r in second]


def test_hf_assisted_records_tokens_and_time_only(pair):
    target, draft = pair
    for temperature in (0.0, 0.6):
        figures = measure_hf_assisted(target.model, draft.model, PROMPTS[0], 8, SamplingParams(temperature, 0.9, 0),
                                      STOP, pad_id=49)
        assert set(figures) == set(FIGURES)
        assert 1 <= figures["new_tokens"] <= 8 and figures["wall_s"] > 0
        assert figures["tokens_per_s"] == pytest.approx(figures["new_tokens"] / figures["wall_s"])
        assert figures["gen_rate"] is None and figures["target_s"] is None and figures["iterations"] is None


def row(engine: str, budget: int | None, temperature: float, gen_rate: float | None, tokens_per_s: float,
        draft_s: float | None = 0.0, iterations: int | None = 4, tree: float | None = 0.0) -> dict:
    target_s = None if iterations is None else 0.1 * iterations
    return {"engine": engine, "budget": budget, "temperature": temperature, "gen_rate": gen_rate,
            "tokens_per_s": tokens_per_s, "draft_s": draft_s, "target_s": target_s, "iterations": iterations,
            "mean_tree_size": tree, "mean_depth": None if tree is None else tree / 4}


SYNTHETIC = [
    row("specexec", 16, 0.6, 2.0, 10.0, draft_s=0.2, tree=16.0),
    row("specexec", 16, 0.6, 3.0, 14.0, draft_s=0.6, tree=15.0),
    row("specexec", 64, 0.6, 3.5, 12.0, draft_s=0.8, tree=64.0),
    row("specexec", 16, 0.0, 2.5, 11.0, draft_s=0.4, tree=16.0),
    row("autoregressive", None, 0.6, 1.0, 8.0),
    row("autoregressive", None, 0.0, 1.0, 8.5),
    row(HF_ASSISTED, None, 0.6, None, 9.0, draft_s=None, iterations=None, tree=None),
]


def test_summary_averages_over_prompts_per_configuration():
    entries = configurations(SYNTHETIC)
    assert [(e.engine, e.budget, e.temperature, e.prompts) for e in entries] == [
        ("specexec", 16, 0.6, 2), ("specexec", 64, 0.6, 1), ("specexec", 16, 0.0, 1),
        ("autoregressive", None, 0.6, 1), ("autoregressive", None, 0.0, 1), (HF_ASSISTED, None, 0.6, 1),
    ]
    first = entries[0]
    assert first.gen_rate == 2.5 and first.tokens_per_s == 12.0
    assert first.draft_ms == pytest.approx(100.0)  # (200 ms / 4 + 600 ms / 4) / 2
    assert first.target_ms == pytest.approx(100.0) and first.tree_size == 15.5
    table = render_table(entries).splitlines()
    assert table[0].startswith("| engine | budget K | temperature | prompts | gen rate | tokens/s |")
    assert table[2] == "| specexec | 16 | 0.6 | 2 | 2.50 | 12.00 | 100 | 100 | 16 | 3.9 |"
    assert table[5] == "| autoregressive | - | 0.6 | 1 | 1.00 | 8.00 | 0 | 100 | 0 | 0.0 |"
    assert table[7] == "| hf-assisted | - | 0.6 | 1 | - | 9.00 | - | - | - | - |"


def test_pool_of_hand_made_rows():
    rows = [
        {"new_tokens": 8, "iterations": 2, "wall_s": 1.0, "draft_s": 0.2, "target_s": 0.4, "mean_tree_size": 16.0,
         "mean_depth": 3.0},
        {"new_tokens": 4, "iterations": 4, "wall_s": 3.0, "draft_s": 0.4, "target_s": 0.8, "mean_tree_size": 10.0,
         "mean_depth": 6.0},
    ]
    # 12 tokens over 6 passes, not the mean of 4.0 and 1.0; depth (3*2 + 6*4) / 6
    assert pool(rows) == pytest.approx({"gen_rate": 2.0, "tokens_per_s": 3.0, "draft_ms": 100.0, "target_ms": 200.0,
                                        "tree": 12.0, "depth": 5.0})


def test_plots_are_small_pngs(tmp_path):
    paths = write_plots(SYNTHETIC, tmp_path)
    assert sorted(p.name for p in paths) == [
        "gen_rate_vs_budget.png", "target_time_vs_tokens.png", "tokens_per_s_vs_budget.png"
    ]
    for path in paths:
        width, height = png_size(path)
        assert width <= 800 and height == 400 and path.stat().st_size < 200_000


def test_bench_command_end_to_end(monkeypatch, capsys, tmp_path, tiny_dirs):  # noqa: F811
    target, draft, _ = tiny_dirs
    args = ["bench", "--out", str(tmp_path), "--engines", "autoregressive,specexec", "--budgets", "2,4",
            "--temperature", "0", "--n-prompts", "2", "--max-new-tokens", "3", "--target", str(target),
            "--draft", str(draft), "--dtype", "float32", "--compare-hf"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    rows = read_rows(tmp_path / RESULTS_FILE)
    assert [(r["engine"], r["budget"]) for r in rows] == [
        ("autoregressive", None), ("autoregressive", None), ("specexec", 2), ("specexec", 2),
        ("specexec", 4), ("specexec", 4), (HF_ASSISTED, None), (HF_ASSISTED, None),
    ]
    assert all(r["dtype"] == "float32" and r["offload"] == "none" and r["target"] == str(target) for r in rows)
    assert "| hf-assisted | - | 0 | 2 | - |" in out
    assert len(out.strip().splitlines()) == 2 + 4
    for name in ("gen_rate_vs_budget.png", "tokens_per_s_vs_budget.png", "target_time_vs_tokens.png"):
        png_size(tmp_path / name)
    code, _, _ = run_cli(monkeypatch, capsys, *args)  # everything measured: nothing is appended
    assert code == 0 and len(read_rows(tmp_path / RESULTS_FILE)) == 8


@pytest.mark.parametrize("args, fragment", [
    (["--engines", "specexec,warp"], "unknown engine warp"),
    (["--dataset", "alpaca"], "unknown dataset 'alpaca'"),
    (["--budgets", "16,0"], "--budgets must be between 1 and 8192 (got 0)"),
    (["--budgets", "9000"], "--budgets must be between 1 and 8192 (got 9000)"),
    (["--budgets", "16,big"], "--budgets takes a comma list of numbers"),
    (["--temperature", "0.6,6"], "--temperature must be between 0 and 5 (got 6.0)"),
    (["--temperature", ","], "--temperature is empty"),
    (["--n-prompts", "0"], "--n-prompts must be >= 1 (got 0)"),
    (["--n-prompts", "81"], "mtbench has only 80 prompts"),
    (["--offload", "cloud"], "unknown offload tier 'cloud'"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
])
def test_bench_bad_input_is_one_line_exit_2(monkeypatch, capsys, tmp_path, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--out", str(tmp_path), *args)
    assert_one_line_error(code, err, fragment)


def test_bench_out_that_is_a_file_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--out", str(tmp_path / "x"), "--engines", "nope")
    assert_one_line_error(code, err, "unknown engine nope")
    (tmp_path / "x").write_text("")
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--out", str(tmp_path / "x"))
    assert_one_line_error(code, err, "is a file, not a directory")
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--out", str(tmp_path / "x" / "sub"))
    assert_one_line_error(code, err, "cannot create it")
    for blank in ("", " "):  # `--out "$DIR"` with DIR unset: not the current directory, unsaid
        code, _, err = run_cli(monkeypatch, capsys, "bench", "--out", blank)
        assert_one_line_error(code, err, "--out is empty: name a directory")


def test_auto_is_swept_for_specexec_only():
    points = plan_points(["specexec", "sd"], [AUTO, 8], [0.0], compare_hf=False)
    assert points == [Point("specexec", AUTO, 0.0), Point("specexec", 8, 0.0), Point("sd", 8, 0.0)]


def test_dsi_refuses_auto_as_its_lookahead():
    setup = replace(SETUP, workers="cpu,cpu")
    with pytest.raises(SpecchatError, match="dsi takes --budgets as its lookahead: numbers up to 64 .got auto,4."):
        check_bench(setup, ["dsi"], [AUTO, 4], 2, compare_hf=False, out_dir=Path("unused"))
    assert parse_budget_item("auto") == AUTO and parse_budget_item("16") == 16
