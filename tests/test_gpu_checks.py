"""The GPU check's code on this CPU: the checks that run on any device run here (a ring smaller
than a pass, GPTQ streamed from RAM and disk, the probe), the others' logic with stand-ins, and
the script and its shell entry say there is nothing to check without a GPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_checks import auto_offload, drafts, replies, verdict
from gpu_checks.auto_offload import accepted_budget, check_auto_offload, refused
from gpu_checks.bandwidth import check_bandwidth
from gpu_checks.probe_costs import check_probe, probe_verdict
from gpu_checks.replies import GreedyJudge, Run
from gpu_checks.streamed_logits import check_gptq_streamed, check_ring_reuse
from gpu_checks.suite import run_all
from gpu_checks.verdict import Verdict, exit_code, table

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
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


def test_the_probe_check_times_every_size_the_probe_measures(tiny_target):
    result = check_probe(tiny_target, 4)
    assert result.status in ("PASS", "FAIL")  # a verdict on timings, which a busy CPU may skew
    assert all(f"n={n}:" in result.detail for n in (1, 2, 4))


def test_the_probe_verdict_holds_within_the_factor_and_fails_outside_it():
    assert probe_verdict("p", (1, 2), (1.0, 1.9), [1.0, 1.0]).status == "PASS"
    launches_only = probe_verdict("p", (1, 512), (1e-3, 1e-3), [1e-3, 50e-3])  # what an unsynchronized probe saw
    assert launches_only.status == "FAIL" and "ratios 0.02..1.00" in launches_only.detail


def test_the_cuda_only_checks_skip_with_a_reason_on_the_cpu(tmp_path):
    assert check_bandwidth(CPU, tmp_path).status == "SKIP"
    judge = GreedyJudge(tmp_path)
    assert check_auto_offload(judge, CPU) == verdict.skipped(auto_offload.CHECK, "no CUDA device: "
                                                                               "--vram-budget budgets GPU memory")
    assert drafts.check_draft("nf4", judge, CPU).status == "SKIP"
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
@pytest.mark.parametrize("command", [[sys.executable, "scripts/gpu_check.py"], ["bash", "scripts/gpu_check.sh"]])
def test_without_a_gpu_the_check_says_so_and_exits_0(command):
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "nothing to check" in done.stdout, done.stderr
