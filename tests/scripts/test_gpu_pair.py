"""`gpu_check.sh --pair` on this CPU: its --dry-run writes both alias pairs shrunk, with random
weights, and runs `specchat generate --json` on them end to end; its rows, projections and
verdicts are worked out here from figures given by hand."""

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gpu_checks import pair
from gpu_checks.pair import card_placement, expansion_served, gemm_served
from gpu_checks.pair_aliases import PAIRS
from gpu_checks.pair_rows import BudgetRow, budget_row, passes_line, plan_line, projected_s, row_line
from gpu_checks.pair_verdicts import pair_verdicts
from helpers.scripts import load_script

from specchat import machine_choices
from specchat.machine_choices import measured, write_kept

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

ROOT = Path(__file__).resolve().parents[2]
DRY_RUN_TIMEOUT_S = 300
INT8_FORMS = ("int8", "int8 with dense copies for wide steps")  # the GPTQ pair's draft, by this CPU's probe
PLAN = {"resident_layers": 16, "ram_layers": 64, "disk_layers": 0, "pass_bytes": 29.09e9, "context": 4096,
        "draft_quant": "none", "notes": []}


def test_the_dry_run_runs_both_pairs_through_generate_on_the_cpu(tmp_path):
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--pair", "--dry-run", "--trace", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=DRY_RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pair check on the CPU")
    assert [line for line in lines if line.startswith("writing ")] == [
        f"writing {aliases.target} and {aliases.draft} with random weights ..." for aliases in PAIRS]
    assert sum(line.startswith("written in ") and line.endswith(" s") for line in lines) == 2  # how long each took
    rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| 16 | ")]
    assert len(rows) == 2, done.stdout  # one budget, each pair
    for cells in rows:
        assert cells[1] == "16, 4" and float(cells[2]) == 4.0  # ranked: the whole budget, max_depth deep
    assert sum(line.startswith("doctor (") for line in lines) == 2  # doctor on each written pair, before generate
    # doctor names the draft's form generate then runs it in (each pair's first placement, below): the GPTQ pair's
    # int8 draft keeps dense copies for wide steps where this CPU's int8 probe measured a crossover (the AMX Xeon of
    # 2026-12-05's CI did; the same CPU at another load, and the EPYCs, measured none); the AWQ pair's runs packed.
    # Doctor and generate are two processes: a crossover kept from a busy measurement is measured again by a process
    # that starts quiet (machine_choices.remembered), so the copies may differ between the two (CI saw doctor's
    # "int8" beside generate's copies, 2026-12-05); the form's kind may not.
    contexts = [line for line in lines if line.startswith("  context ")]
    forms = [placed_form(line) for line in lines if line.startswith("budget 16: placement: ")]
    assert forms[0] in INT8_FORMS and forms[1] == "none"
    doctors = [re.search(r"draft in (.+)$", context).group(1) for context in contexts]
    assert [doctors[0] in INT8_FORMS, doctors[1]] == [True, "none"], contexts
    # each budget's row and placement follow its reply at once: a command cut short at its limit keeps them
    exits = [index for index, line in enumerate(lines) if line.startswith("budget 16: exited 0 after ")]
    assert len(exits) == 4  # each pair's reply, then its traced one (--trace, below)
    for exited in exits[::2]:
        said = labelled(lines[exited + 1:], "budget 16: ")
        assert said[0].startswith("| 16 | 16, 4 | 4.0 | ")
        assert said[1].startswith("placement: 1 resident, 0 in RAM, 2 on disk")
        # why the draft is in its form, where this CPU's measured dense copies gave auto a choice (int8 beside
        # int8 with copies for wide steps), then the passes
        passes = next(index for index, line in enumerate(said) if line.startswith("each tree's pass, s: "))
        assert all(line.startswith("  draft in ") for line in said[2:passes])
        assert said[passes].startswith("each tree's pass, s: 0.")
    placements = [line for line in lines if line.startswith("placement: ")]
    assert placements[0].startswith("placement: 1 resident, 0 in RAM, 2 on disk")
    # the AWQ draft packed, with its whole head as it ran (the logits of 128256 words: 26 resident with the default
    # sub-vocabulary, as doctor plans the card; the target's and the draft's input embeddings held on the host)
    assert "draft in none; the 24 GB card's plan: 24 resident, 25.46 GB a pass" in placements[1]
    # the AWQ pair's four (draft, host, 1024, projection) and the GPTQ pair's three
    assert sum("dry run: no verdict" in line for line in lines) == 7
    assert lines.count("int4_gemm served nothing: no 4-bit draft linear on CUDA was probed") == 2  # a CPU's drafts
    assert lines.count("int4 expansion served nothing: no 4-bit linear on CUDA was probed") == 2
    # --trace: one more reply a pair at the judged budget, traced (in no row) and summed up: the GPTQ pair's
    # seven iterations hold the three traced; the AWQ pair's trees accepted enough to end sooner
    traced = lines.index("budget 16, traced in trace-llama-2-70b-gptq-16.json.gz:")
    spans = [f"| {step} | {span} | " for step in (3, 4, 5) for span in ("draft", "pass", "verify")]
    assert all(line.startswith(span) for line, span in zip(lines[traced + 3:traced + 12], spans, strict=True))
    assert (tmp_path / "trace-llama-2-70b-gptq-16.json.gz").is_file()
    for exited in exits[1::2]:
        assert lines[exited + 1].startswith(("budget 16, traced in ", "budget 16: traced nothing: "))
    assert "Traceback" not in done.stderr


def placed_form(placement: str) -> str:
    """The draft's form a placement line names ("..., draft in FORM; the 24 GB card's plan: ...")."""
    return re.search(r"draft in ([^;]+);", placement).group(1)


def labelled(lines: list[str], label: str) -> list[str]:
    """The run of `lines` from the first that begin with `label`, without it."""
    said = []
    for line in lines:
        if not line.startswith(label):
            break
        said.append(line.removeprefix(label))
    return said


def test_only_checks_the_pair_of_one_target(tmp_path, monkeypatch):
    """`--only TARGET` reaches run_pair, which checks that target's pair alone (the check itself
    stood in for: the dry run above runs it)."""
    options = load_script("gpu_check").parse(["--pair", "--dry-run", "--only", "llama-3.1-70b-awq"])
    checked = []
    monkeypatch.setattr(pair, "check_pair", lambda aliases, *rest: checked.append(aliases) or [])
    assert pair.run_pair(pair.DRY_PAIR, torch.device("cpu"), tmp_path, options.only) == 0
    assert [(aliases.target, aliases.draft) for aliases in checked] == [("llama-3.1-70b-awq", "llama-3.1-8b-awq")]


def row(budget: int = 1024, draft_s: float = 0.3, steps: float = 24.0, pass_s: float = 1.0, stall_s: float = 0.2,
        host_s: float = 0.02, gbps: float = 29.09, tree_host_s: float = 0.0) -> BudgetRow:
    return BudgetRow(budget, 5, budget, 24, steps, draft_s, pass_s, stall_s, 0.0, 29.09e9, 0.05, host_s, gbps, PLAN,
                     tree_host_s)


def test_a_row_is_the_mean_of_the_tree_iterations_and_host_time_is_what_no_event_holds():
    events = [{"tree_size": 0, "depth": 0, "draft_steps": 0, "draft_s": 0.0, "pass_s": 0.0, "stall_s": 0.0,
               "start_stall_s": 0.0, "transfer_bytes": 10, "target_s": 2.0, "tree_host_s": 0.0, "graphs_captured": 0},
              {"tree_size": 8, "depth": 4, "draft_steps": 4, "draft_s": 0.4, "pass_s": 0.8, "stall_s": 0.1,
               "start_stall_s": 0.04, "transfer_bytes": 30, "target_s": 0.9, "tree_host_s": 0.04, "graphs_captured": 0},
              {"tree_size": 8, "depth": 2, "draft_steps": 2, "draft_s": 0.2, "pass_s": 0.6, "stall_s": 0.3,
               "start_stall_s": 0.0, "transfer_bytes": 10, "target_s": 0.8, "tree_host_s": 0.02, "graphs_captured": 0}]
    record = {"iterations": events, "summary": {"wall_s": 5.6, "transfer_gbps": 2.0}, "plan": PLAN}
    made = budget_row(8, record)
    assert (made.trees, made.tree_size, made.depth, made.draft_steps) == (2, 8, 3, 3)
    assert made.draft_s == pytest.approx(0.3) and made.pass_s == pytest.approx(0.7)
    assert made.stall_s == pytest.approx(0.2) and made.start_stall_s == pytest.approx(0.02) and made.streamed == 20
    assert made.verify_s == pytest.approx(0.15)  # 0.85 of target time less 0.7 of pass
    assert made.host_s == pytest.approx((5.6 - 4.3) / 3)  # wall less the events' 4.3 s, over 3 iterations
    assert made.tree_host_s == pytest.approx(0.03)
    assert made.step_ms == pytest.approx(90.0)  # 0.3 s of drafting less 0.03 of bookkeeping, over 3 steps
    with pytest.raises(ValueError, match="drafted 0 tree"):
        budget_row(8, record | {"iterations": events[:1]})


def test_a_row_leaves_out_the_trees_that_warm_up():
    first = {"tree_size": 8, "depth": 4, "draft_steps": 4, "draft_s": 4.0, "pass_s": 3.0, "stall_s": 0.0,
             "start_stall_s": 0.0, "transfer_bytes": 30, "target_s": 3.5, "tree_host_s": 0.0, "graphs_captured": 0}
    later = first | {"draft_s": 0.4, "pass_s": 0.8, "target_s": 0.9}
    record = {"iterations": [first, later, later], "summary": {"wall_s": 10.0, "transfer_gbps": 2.0}, "plan": PLAN}
    made = budget_row(8, record, warm_trees=1)
    assert made.trees == 2 and made.draft_s == pytest.approx(0.4) and made.pass_s == pytest.approx(0.8)
    assert budget_row(8, record).draft_s == pytest.approx(1.6)  # none left out: the first's 4 s counts
    with pytest.raises(ValueError, match="drafted 3 tree\\(s\\), none past the 3 warming up"):
        budget_row(8, record, warm_trees=3)
    assert passes_line(made, 1) == "each tree's pass, s: 3.000 (warming up) | 0.800 0.800"
    assert passes_line(made, 0) == "each tree's pass, s: 3.000 0.800 0.800"


def test_a_row_leaves_out_a_later_tree_that_captured_a_draft_steps_graph():
    """The catch-up's one-row step is captured by a reply's third tree: that tree's one-time capture
    stays out of the means, and its pass is starred."""
    steady = {"tree_size": 8, "depth": 4, "draft_steps": 4, "draft_s": 0.4, "pass_s": 0.8, "stall_s": 0.0,
              "start_stall_s": 0.0, "transfer_bytes": 30, "target_s": 0.9, "tree_host_s": 0.0, "graphs_captured": 0}
    capturing = steady | {"draft_s": 0.6, "pass_s": 0.7, "graphs_captured": 1}
    record = {"iterations": [capturing, steady, capturing, steady], "summary": {"wall_s": 10.0, "transfer_gbps": 2.0},
              "plan": PLAN}
    made = budget_row(8, record, warm_trees=1)
    assert made.trees == 2 and made.draft_s == pytest.approx(0.4) and made.pass_s == pytest.approx(0.8)
    assert passes_line(made, 1) == ("each tree's pass, s: 0.700 (warming up) | 0.800 0.700* 0.800 "
                                    "(*: captured a draft step's graph, left out)")
    with pytest.raises(ValueError, match="none past the 1 warming up that captured no graph"):
        budget_row(8, record | {"iterations": [capturing, capturing]}, warm_trees=1)


def test_a_second_reply_with_other_options_prints_its_row_beside_labelled(monkeypatch, capsys, tmp_path):
    first = {"tree_size": 8, "depth": 4, "draft_steps": 4, "draft_s": 4.0, "pass_s": 3.0, "stall_s": 0.0,
             "start_stall_s": 0.0, "transfer_bytes": 30, "target_s": 3.5, "tree_host_s": 0.0, "graphs_captured": 0}
    record = {"iterations": [first, first | {"pass_s": 0.8, "target_s": 0.9}],
              "summary": {"wall_s": 10.0, "transfer_gbps": 2.0},
              "plan": PLAN | {"notes": ["draft in int8: the shortest predicted iteration of a full tree (...)"]}}
    monkeypatch.setattr(pair, "card_placement", lambda *args: SimpleNamespace(resident=16, pass_bytes=29.09e9))
    sizes = replace(pair.FULL_PAIR, warm_trees=1, also=("--resident-layers", "0"))
    pair.say_row(PAIRS[1], budget_row(8, record, 1), sizes, torch.device("cpu"), tmp_path,
                 "budget 8 with --resident-layers 0")
    lines = capsys.readouterr().out.splitlines()
    # every line labelled, the placement's note on why the draft is in its form too
    assert [line.split(": ", 1)[0] for line in lines] == ["budget 8 with --resident-layers 0"] * 4
    assert lines[0].endswith(row_line(budget_row(8, record, 1), 29.09e9))
    assert lines[2].endswith(":   draft in int8: the shortest predicted iteration of a full tree (...)")
    assert lines[3].endswith("each tree's pass, s: 3.000 (warming up) | 0.800")


@pytest.mark.parametrize("trace_also", [False, True])
def test_the_traced_reply_takes_the_second_replys_options_with_trace_also(trace_also, monkeypatch, tmp_path):
    asked = []

    def generate(target, draft, budget, sizes, workdir, extra=()):
        asked.append(extra)
        return {"iterations": [{}] * (pair.SKIPPED_ITERATIONS + pair.TRACED_ITERATIONS + 1)}

    monkeypatch.setattr(pair, "generate", generate)
    monkeypatch.setattr(pair, "read_trace", lambda path: [])
    monkeypatch.setattr(pair, "summary_text", lambda events, spans, kernels: "(the summary)")
    sizes = replace(pair.FULL_PAIR, also=("--resident-layers", "0"), trace_also=trace_also)
    said = pair.traced(tmp_path / "target", tmp_path / "draft", sizes, tmp_path, tmp_path / "trace.json.gz")
    also = ("--resident-layers", "0") if trace_also else ()
    assert asked == [(*also, "--trace", str(tmp_path / "trace.json.gz"))]
    label = "budget 1024 with --resident-layers 0" if trace_also else "budget 1024"
    assert said == f"{label}, traced in trace.json.gz:\n(the summary)"


def test_the_placement_line_says_why_the_draft_is_in_its_form_where_auto_chose():
    chose = "draft in int4: the shortest predicted iteration of a full tree (none: ...; int4: ...)"
    chosen = replace(row(), plan=PLAN | {"draft_quant": "int4", "notes": ["context 2048 tokens: 4096 does not fit", chose]})
    assert plan_line(chosen, 16, 29.09e9).splitlines()[1:] == [f"  {chose}"]
    assert len(plan_line(row(), 16, 29.09e9).splitlines()) == 1  # no choice: the placement alone


def test_the_24_gb_card_pass_is_bounded_by_the_slower_of_compute_and_its_link():
    # 29.09 GB at 25 GB/s streams 1.1636 s, above the 0.8 s of compute (1.0 pass less 0.2 stall)
    assert projected_s(row(), 29.09e9, 25.0) == pytest.approx(0.3 + 1.1636 + 0.05 + 0.02)
    assert projected_s(row(), 10e9, 25.0) == pytest.approx(0.3 + 0.8 + 0.05 + 0.02)  # 0.4 s of streaming: compute


def statuses(rows: list[BudgetRow], target: str = "llama-3.1-70b-awq") -> list[str]:
    return [v.status for v in pair_verdicts(target, rows, 29.09e9, dry_run=False)]


def test_the_verdicts_hold_up_to_their_bounds():
    # a step 0.3 s / 24 = 12.5 ms; host 0.02 of 1.37 s; 1.37 s over 1.0 s of streaming; 20 / 1.5336 = 13.0 tokens/s
    assert statuses([row(draft_s=0.24)]) == ["PASS", "PASS", "FAIL", "PASS"]  # 10 ms a step; 1.31x
    assert statuses([row(draft_s=0.2)]) == ["PASS", "PASS", "PASS", "PASS"]  # 1.27x
    assert statuses([row()])[0] == "FAIL"  # 12.5 ms a step
    assert statuses([row(draft_s=0.2, host_s=0.07)])[1] == "FAIL"  # 5.1% of 1.32 s
    # 0.05 s of the tree's bookkeeping: host work 0.07 of 1.37 s (5.1%), no longer in the step's 10.4 ms
    assert statuses([row(draft_s=0.3, tree_host_s=0.05)])[:2] == ["FAIL", "FAIL"]
    assert statuses([row(draft_s=0.28, tree_host_s=0.05)])[:2] == ["PASS", "FAIL"]  # 9.6 ms a step; 5.2%
    assert statuses([row(draft_s=0.26, tree_host_s=0.04)])[:2] == ["PASS", "PASS"]  # 0.06 of 1.33 s: 4.5%
    assert statuses([row(draft_s=0.2, gbps=40.0)])[2] == "FAIL"  # a faster link: 1.27 s over 0.727 s of streaming
    assert statuses([row(draft_s=2.0)])[3] == "FAIL"  # 20 / 3.23 s = 6.2 tokens/s
    assert statuses([row(draft_s=0.2)], "llama-2-70b-gptq") == ["PASS", "PASS", "PASS"]  # no projection verdict
    assert statuses([row(budget=512)]) == ["SKIP"] * 4  # budget 1024 not run
    # the step's bound covers budgets whose steps expand at most 256 nodes (K/8): 2048's, not 4096's
    assert statuses([row(draft_s=0.2), row(budget=2048)])[0] == "FAIL"
    assert statuses([row(draft_s=0.2), row(budget=4096)])[0] == "PASS"


def test_the_iteration_is_judged_against_the_pass_streaming_with_every_layers_beside_it():
    # 1.37 s over 29.09 GB at 29.09 GB/s (1.0 s), 64 of 80 layers streamed: all 80 stream in 1.25 s
    verdict = pair_verdicts("llama-3.1-70b-awq", [row()], 29.09e9, dry_run=False)[2]
    assert row().all_layers_stream_s == pytest.approx(1.25)
    assert verdict.status == "FAIL" and verdict.detail == ("1.370 s, 1.37x the pass's 1.000 s of streaming, bound "
                                                           "1.3x; 1.10x all 80 layers' 1.250 s")


def test_the_card_is_planned_with_the_draft_in_the_form_that_ran(tmp_path):
    """The projection's pass and its measured draft steps are of one plan: a 7B draft that ran
    rounded to 4 bits leaves the card 24 resident layers (24.74 GB a pass), as nf4 does (4.17 GB of
    weights against 3.70 and its input embedding's 0.26 GB on the host, but nothing in preparation
    beside them: 0.46 GB); the full-weight draft (13.2 GB) 4 (33.58 GB)."""
    paper = next(aliases for aliases in PAIRS if aliases.target == "llama-2-70b-gptq")
    rounded, nf4, full = (card_placement(paper, form, tmp_path) for form in ("int4", "nf4", "none"))
    assert (rounded.resident, round(rounded.pass_bytes / 1e9, 2)) == (24, 24.74)
    assert (nf4.resident, round(nf4.pass_bytes / 1e9, 2)) == (24, 24.74)
    assert (full.resident, round(full.pass_bytes / 1e9, 2)) == (4, 33.58)
    # UMbreLLa's pair with its 8B AWQ draft as it may run: packed, or expanded (`auto` weighs both on a GPU)
    umbrella = next(aliases for aliases in PAIRS if aliases.target == "llama-3.1-70b-awq")
    packed, expanded = (card_placement(umbrella, form, tmp_path) for form in ("none", "dense"))
    assert (packed.resident, round(packed.pass_bytes / 1e9, 2)) == (24, 25.46)
    assert (expanded.resident, round(expanded.pass_bytes / 1e9, 2)) == (0, 36.37)


@pytest.fixture
def measured_alone(monkeypatch) -> None:
    """Choices measured as with the cores to themselves: the load reading would add "(measured under
    load)" to the check's line whenever the other worker ran."""
    monkeypatch.setattr(machine_choices, "load_during", lambda measure: (measure(), 0.0))


@pytest.mark.usefixtures("measured_alone")
def test_the_check_says_at_which_widths_int4_gemm_served_as_the_probes_kept_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    for (in_features, out_features), span in (((4096, 14336), [16, 256]), ((4096, 1024), None)):
        key = {"device": "cpu", "in_features": in_features, "out_features": out_features, "dtype": "torch.bfloat16"}
        write_kept(measured("int4 gemm rows", key, torch.device("cpu"), lambda span=span: span))
    write_kept(measured("int4 expand rows", {"device": "cpu"}, torch.device("cpu"), lambda: 64))  # not int4_gemm's
    assert gemm_served() == "int4_gemm served 4096x1024 bfloat16: never, 4096x14336 bfloat16: 16-256 rows"


@pytest.mark.usefixtures("measured_alone")
def test_the_check_says_from_how_many_rows_the_expansion_served(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    for (in_features, out_features), rows in (((8192, 28672), 256), ((8192, 1024), float("inf"))):
        key = {"device": "cpu", "in_features": in_features, "out_features": out_features, "dtype": "torch.bfloat16"}
        write_kept(measured("int4 expansion rows", key, torch.device("cpu"), lambda rows=rows: rows))
    assert expansion_served() == ("int4 expansion served 8192x1024 bfloat16: never, "
                                  "8192x28672 bfloat16: from 256 rows")
