"""The benchmark scripts that write rows into a folder refuse one that already holds their rows,
before loading anything: a rerun measures into a fresh folder and never replaces rows kept; and
what the smaller ones print."""

import json
import os
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch
from helpers.scripts import load_script
from helpers.tiny import tiny_models, tiny_qwen_config
from transformers import Qwen2ForCausalLM

from specchat import loader
from specchat.decoding.tree import TreeShape
from specchat.quant import onednn_float, prepacked

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
KEPT = '{"kept": true}\n'


def run_script(script: str, args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """`python scripts/<script> args`, run in this process: its imports (torch, transformers) are
    this process's, already loaded, where a new interpreter took ~8 s to load them here. Returns the
    exit status and stderr as the interpreter would give them: a `sys.exit(message)` prints the
    message and exits 1. As there, the script's folder leads sys.path (a script imports its siblings)."""
    with pytest.raises(SystemExit) as stopped:
        run_main(script, args, monkeypatch)
    code, stderr = stopped.value.code, capsys.readouterr().err
    if isinstance(code, str):
        return 1, stderr + code + "\n"
    return code or 0, stderr


def script_output(script: str, args: list[str], monkeypatch, capsys) -> list[str]:
    """The lines a script that ends well prints, run in this process as run_script runs it."""
    run_main(script, args, monkeypatch)
    return capsys.readouterr().out.splitlines()


def run_main(script: str, args: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / script), *args])
    monkeypatch.syspath_prepend(str(SCRIPTS))
    runpy.run_path(str(SCRIPTS / script), run_name="__main__")


# Each script also gets an argument it would fail on before loading any model, so that if its
# check went missing the test fails in seconds instead of loading the real pair.
@pytest.mark.parametrize(("script", "flag", "rows", "unusable"), [
    ("bench_offload.py", "--rows-dir", "rows.jsonl", ["--budgets", "x"]),
    ("bench_serve.py", "--out", "rows.jsonl", ["--", "--target", "/nonexistent/model"]),
    ("bench_conversation.py", "--out", "rows.jsonl", ["--tiers", "x"]),
    ("bench_peers.py", "--out", "results.jsonl", ["--temperatures", "x"]),
    ("bench_moe_streaming.py", "--rows-dir", "rows.jsonl", ["--widths", "x"]),
    ("bench_moe_specexec.py", "--rows-dir", "rows.jsonl", ["--budgets", "x"]),
])
def test_a_folder_with_rows_is_refused_and_left_as_it_was(tmp_path, monkeypatch, capsys, script, flag, rows, unusable):
    (tmp_path / rows).write_text(KEPT)
    status, stderr = run_script(script, [flag, str(tmp_path), *unusable], monkeypatch, capsys)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status != 0 and len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and str(tmp_path) in lines[0] and "fresh" in lines[0]
    assert [path.name for path in tmp_path.iterdir()] == [rows] and (tmp_path / rows).read_text() == KEPT


def test_the_conversation_bench_refuses_an_unknown_mode_before_loading(tmp_path, monkeypatch, capsys):
    status, stderr = run_script("bench_conversation.py", ["--out", str(tmp_path), "--modes", "after,later"],
                                monkeypatch, capsys)
    assert status == 2 and "--modes takes before, after or both" in stderr
    assert list(tmp_path.iterdir()) == []


def test_the_stacked_projections_bench_prints_a_row_per_width(monkeypatch, capsys):
    lines = script_output("bench_stacked_projections.py", ["--hidden", "64", "--intermediate", "128", "--kv", "16",
                                                           "--layers", "2"], monkeypatch, capsys)
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| ") and "rows" not in line]
    assert [int(row[0]) for row in rows] == [1, 4, 16, 64]
    assert all(float(cell) > 0 for row in rows for cell in row[1:])


def test_the_draft_forms_bench_prints_each_forms_step_per_width(tmp_path, monkeypatch, capsys):
    tiny_qwen_config(hidden_size=64, intermediate_size=128, num_hidden_layers=6).save_pretrained(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's forms, on a CUDA host too
    lines = script_output("bench_draft_forms.py", ["--draft", str(tmp_path), "--widths", "1,4"], monkeypatch, capsys)
    assert lines[1] == "| tokens a step | none ms | int8 ms | int4 ms | int8 / none | int4 / none |"
    rows = [line.strip("| ").split(" | ") for line in lines[3:]]
    assert [row[0] for row in rows] == ["1", "4"]
    for row in rows:
        assert all(float(cell) >= 0 for cell in row[1:4])  # ms at one decimal: a tiny layer's may print 0.0
        assert all(cell.endswith("x") and float(cell[:-1]) > 0 for cell in row[4:])


@pytest.mark.parametrize(("script", "args", "error"), [
    ("bench_forward_costs.py", ["target", "x"], "argument dtype: invalid choice: 'x'"),
    ("bench_kv_decode.py", ["bf16", "x"], "argument steps: invalid int value: 'x'"),
])
def test_the_forward_benches_refuse_bad_arguments_before_loading(monkeypatch, capsys, script, args, error):
    status, stderr = run_script(script, args, monkeypatch, capsys)
    assert status == 2 and error in stderr and "Traceback" not in stderr


def test_the_ops_count_says_a_cuda_drafts_layer_runs_fewer_ops_and_writes_fewer_bytes(monkeypatch, capsys):
    lines = script_output("count_draft_ops.py", ["--rows", "4", "--shrunk"], monkeypatch, capsys)
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    (plain, plain_ops, plain_mb, _, plain_each), (prepared, prepared_ops, prepared_mb, _, prepared_each) = rows
    assert plain == "as transformers builds it" and prepared == "prepared for CUDA"
    # seven projections in three products; each norm's eight ops (two of them casts) in one
    assert "linear 7" in plain_each and "linear 4" in prepared_each and "rms_norm 2" in prepared_each
    assert "pow" in plain_each and "pow" not in prepared_each
    # llama-3.1-8b's grouped attention: keys and values copied for its query heads, or its mask's rows
    assert "reshape 2" in plain_each and "repeat 1" in prepared_each
    assert int(prepared_ops) < int(plain_ops) and float(prepared_mb) < float(plain_mb)


@pytest.mark.parametrize(("args", "error"), [
    (["--capacity", "100"], "--capacity 100: a step of 16 rows after 8 needs 296"),
    (["--cached", "0"], "--cached 0: a static step follows at least one cached token"),
    (["--rows", "600"], "--rows 600: a static step takes 1 to 512 rows"),
])
def test_the_ops_count_refuses_a_cache_a_step_does_not_fit(args, error, monkeypatch, capsys):
    code, stderr = run_script("count_draft_ops.py", args, monkeypatch, capsys)
    assert code == 2 and error in stderr


def test_the_attention_bench_times_both_paths_and_finds_their_outputs_alike(monkeypatch, capsys):
    lines = script_output("bench_attention.py", ["--shapes", "16:64,24:100", "--trials", "2"], monkeypatch, capsys)
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert [cells[0] for cells in rows] == ["16 x 64", "24 x 100"]
    for _, copied, packed, ratio, apart in rows:
        assert float(copied) > 0 and float(packed) > 0 and ratio.endswith("x")
        # bf16 on the AMD EPYC (2026-11-29): 0 apart up to 256 rows, 1.2e-4 at 1025 (a kernel's blocking)
        assert float(apart) <= 1.2e-4


def test_the_bookkeeping_bench_grows_full_trees_and_times_their_host_work(monkeypatch, capsys):
    lines = script_output("bench_tree_bookkeeping.py", ["--budget", "64", "--depth", "6", "--trees", "2"], monkeypatch,
                          capsys)
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert [cells[0] for cells in rows] == ["1", "2"]
    for _, steps, nodes, depth, host_ms in rows:
        assert (int(steps), int(nodes), int(depth)) == (5, 64, 6) and float(host_ms) > 0


def test_the_bookkeeping_bench_grows_auto_trees_to_their_cap_where_drafting_is_free(monkeypatch, capsys):
    lines = script_output("bench_tree_bookkeeping.py", ["--auto", "--budget", "64", "--depth", "6", "--trees", "2"],
                          monkeypatch, capsys)
    for _, steps, nodes, depth, host_ms in (line.strip("| ").split(" | ") for line in lines[2:]):
        assert int(nodes) == 64 and int(depth) <= 6 and int(steps) > 1 and float(host_ms) > 0


def test_the_bookkeeping_bench_refuses_an_empty_tree(monkeypatch, capsys):
    code, stderr = run_script("bench_tree_bookkeeping.py", ["--budget", "0"], monkeypatch, capsys)
    assert code == 2 and "--budget, --depth and --trees are at least 1" in stderr


def test_the_tree_widths_bench_counts_a_trees_steps_and_rows(tiny_target, tiny_draft):
    """On the tiny pair: a ranked tree runs max_depth steps and fills its budget; a real one of the
    same budget, as its draft predicts, runs fewer rows; the tree steps' rows are counted, the
    catch-up's not (steps of the expansion batch's width at most)."""
    widths = load_script("bench_tree_widths")
    stop_ids = []
    ranked = widths.tree_widths(tiny_target, tiny_draft, stop_ids, TreeShape(32, 6, batch=8, ranked_tree=True),
                                [[3, 1, 4]], 4)
    real = widths.tree_widths(tiny_target, tiny_draft, stop_ids, TreeShape(32, 6, batch=8), [[3, 1, 4], [2, 7]], 8)
    assert ranked.trees >= 1 and ranked.steps == 6 * ranked.trees  # a catch-up, then 5 steps to depth 6
    assert 5 * ranked.trees < ranked.rows <= 8 * 5 * ranked.trees
    assert real.trees >= 2 and 0 < real.rows <= 8 * (real.steps - real.trees)
    cells = real.row("real").strip("| ").split(" | ")
    assert cells[:2] == ["real", str(real.trees)] and float(cells[5]) == round(real.rows / (real.steps - real.trees))


@pytest.mark.parametrize("args", [["--budgets", "256,0"], ["--batches", "64,0"]])
def test_the_tree_widths_bench_refuses_an_empty_budget_or_batch(args, monkeypatch, capsys):
    code, stderr = run_script("bench_tree_widths.py", args, monkeypatch, capsys)
    assert code == 2 and "every budget and batch are at least 1" in stderr


def test_the_probe_bench_times_the_probe_over_the_apps_cap_with_choices_kept_apart(tiny_target, tiny_draft,
                                                                                     monkeypatch, capsys):
    """The app's models (the tiny pair stands in for the loaded defaults), probed `--runs` times at
    auto's own cap; the load's machine choices go to a temporary folder, not the one in use."""
    in_use, loads = os.environ["SPECCHAT_PROBE_DIR"], []

    def load_tiny(options, progress):
        loads.append((options.offload, os.environ["SPECCHAT_PROBE_DIR"]))
        return tiny_models(tiny_target, tiny_draft)

    monkeypatch.setattr(loader, "load_models", load_tiny)
    lines = script_output("bench_probe.py", ["--runs", "2", "--offload", "none"], monkeypatch, capsys)
    ((offload, probes),) = loads
    assert offload == "none" and probes != in_use and not Path(probes).exists()  # removed after the runs
    runs = [line for line in lines if line.startswith("run ")]
    assert [line.split(":")[0] for line in runs] == ["run 0", "run 1"]
    assert all(re.search(r"probe [\d.]+ s; target sizes \(1, 2, ", line) for line in runs)


def test_the_widened_bench_times_both_targets_at_each_size_and_a_prefill(tmp_path, monkeypatch, capsys):
    """A tiny dense bf16 target (every linear plain: 2 layers x 7 and the head), widened from 2 rows
    whatever this CPU measured, on a CPU without bf16 instructions (where bf16 prepacking does not
    pay: on one with them the linears are prepacked, not widened, and the bench has nothing to time)."""
    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_qwen_config(vocab_size=1024, hidden_size=64, intermediate_size=128)).save_pretrained(tmp_path)
    monkeypatch.setattr(prepacked, "widened_rows", lambda dtype: 2)
    monkeypatch.setattr(prepacked, "prepack_pays", lambda dtype: False)
    lines = script_output("bench_widened.py", ["--target", str(tmp_path), "--weights", "dense", "--sizes", "1,4",
                                               "--prefill", "8", "--runs", "1"], monkeypatch, capsys)
    assert lines[1] == "linears widened: 15, through oneDNN: 0 (rows []: in, out, span)"
    rows = [line.strip("| ").split(" | ") for line in lines[4:]]
    assert [row[0] for row in rows] == ["trunk n=1 after 100", "trunk n=4 after 100", "head over those 4 rows",
                                        "prefill 8"]
    assert all(float(cell) >= 0 for row in rows for cell in row[1:])


def test_the_widened_bench_in_float32_times_the_target_routed_through_onednn(tmp_path, monkeypatch, capsys):
    """A tiny dense float32 target: every linear routed (2 layers x 7 and the head) over a span of its
    own shape whatever this CPU measured, none widened (float32 has nothing to widen)."""
    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_qwen_config(vocab_size=1024, hidden_size=64, intermediate_size=128)).save_pretrained(tmp_path)
    monkeypatch.setattr(onednn_float, "onednn_span", lambda in_features, out_features, dtype: (2, in_features))
    lines = script_output("bench_widened.py", ["--dtype", "float32", "--target", str(tmp_path), "--weights", "dense",
                                               "--sizes", "4", "--prefill", "8", "--runs", "1"], monkeypatch, capsys)
    assert lines[1] == ("linears widened: 0, through oneDNN: 15 (rows [(64, 32, (2, 64)), (64, 64, (2, 64)), "
                        "(64, 128, (2, 64)), (64, 1024, (2, 64)), (128, 64, (2, 128))]: in, out, span)")
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| trunk n=4 after 100", "| head over those 4 rows",
                                                            "| prefill 8"]


def test_the_prediction_bench_decodes_each_request_every_way_and_finds_the_same_tokens(tiny_target, tiny_draft,
                                                                                       monkeypatch, capsys):
    from helpers.serve_helpers import TINY_TOKENIZER

    asked = []
    monkeypatch.setattr(loader, "load_models", lambda options, progress: asked.append(options) or tiny_models(
        tiny_target, tiny_draft, TINY_TOKENIZER))
    lines = script_output("bench_prediction.py", ["--edits", "2", "--max-new-tokens", "12", "--offload", "disk",
                                                  "--resident-layers", "0"], monkeypatch, capsys)
    assert (asked[0].offload, asked[0].resident_layers) == ("disk", 0)  # the target as the run asked it placed
    same = {"predicted": True, "quoted": True}  # float32 tiny models: the trees' rows round alike
    assert [json.loads(line) for line in lines if "same_tokens" in line] == [
        {"request": 0, "kind": "edit", "same_tokens": same}, {"request": 1, "kind": "edit", "same_tokens": same},
        {"request": 2, "kind": "explain", "same_tokens": same}, {"request": 3, "kind": "explain", "same_tokens": same}]
    decoded = [json.loads(line) for line in lines if '"form"' in line]
    assert len(decoded) == 12 and all(row["target_s"] > 0 and row["draft_s"] >= 0 and row["tree_size"] >= 0
                                      for row in decoded)  # where the time went (auto may draft no tree)
    assert any(row["tree_size"] > 0 and row["draft_s"] > 0 for row in decoded)
    table = [line.split(" | ") for line in lines if line.startswith("| e")]
    assert [row[:2] for row in table] == [["| edit", form] for form in ("plain", "predicted", "quoted")] + \
        [["| explain", form] for form in ("plain", "predicted", "quoted")]
    assert all(len(row) == 7 and re.fullmatch(r"[\d.]+ / [\d.]+ \|", row[-1]) for row in table)
    assert all(re.fullmatch(rf"{kind}: predicted / plain [\d.]+x, quoted / plain [\d.]+x", line)
               for kind, line in zip(("edit", "explain"), lines[-2:]))


def test_the_copy_contention_bench_times_the_step_alone_and_beside_the_loader(monkeypatch, capsys):
    lines = script_output("bench_copy_contention.py", ["--dry-run", "--steps", "4"], monkeypatch, capsys)
    assert lines[0].startswith("a 2-layer draft stand-in at 128 rows on cpu, 40 host ops and 0.03 MB of input rows "
                               "copied between steps")  # 128 rows of 64 float32
    rows = [line.strip("| ").split(" | ") for line in lines[3:]]
    assert [cells[0] for cells in rows] == ["alone", "beside the loader's copies"]  # loads in pieces: CUDA's alone
    assert all(float(cells[1]) > 0 and float(cells[2]) >= float(cells[1]) for cells in rows)
    assert rows[0][4] == "none" and float(rows[1][4]) > 0  # the loader moved bytes while the steps ran


def test_the_copy_contention_bench_copies_no_input_rows_when_told(monkeypatch, capsys):
    lines = script_output("bench_copy_contention.py", ["--dry-run", "--steps", "2", "--no-inputs"], monkeypatch, capsys)
    assert "40 host ops and no input rows copied between steps" in lines[0]


def test_the_copy_contention_bench_pulls_the_inputs_in_rows_of_its_own_on_cuda():
    """On CUDA the loads also go in pieces and, where the steps take inputs, the inputs are also pulled
    by the device's threads, alone and beside the loads; on a CPU a pull is the copy, so no such rows."""
    bench = load_script("bench_copy_contention")
    pulled = [mode for mode, load in bench.modes(cuda=True, inputs=True) if load.pulled]
    assert pulled == ["alone, the inputs pulled by the device's threads",
                      "beside the loader's copies, the inputs pulled"]
    assert [load.piece for mode, load in bench.modes(cuda=True, inputs=True) if load.pulled] == [None, 0]
    assert not any(load.pulled for _, load in bench.modes(cuda=True, inputs=False))
    assert [mode for mode, _ in bench.modes(cuda=False, inputs=True)] == ["alone", "beside the loader's copies"]


@pytest.mark.parametrize("pulled", [False, True])
def test_the_copy_contention_books_move_new_rows_into_the_steps_inputs(pulled):
    bench = load_script("bench_copy_contention")
    rows = torch.zeros(4, 8)
    books = bench.books_of(3, torch.device("cpu"), rows, pulled)
    books()
    first = rows.clone()
    books()
    assert first.abs().sum() > 0 and not torch.equal(rows, first)  # new rows each step, moved in


def test_the_copy_contention_bench_refuses_an_empty_step(monkeypatch, capsys):
    code, stderr = run_script("bench_copy_contention.py", ["--rows", "0"], monkeypatch, capsys)
    assert code == 2 and "--rows and --steps are at least 1, --host-ops at least 0" in stderr
