"""`specchat doctor`: the recommendation rule, the report, and the command end to end."""

import re
from dataclasses import replace

import pytest
import torch
from helpers.cli import run_cli
from helpers.doctor_facts import GB, made_up_facts

from specchat.doctor.advice import Recommendation, advise
from specchat.doctor.facts import CudaDevice
from specchat.doctor.limit import Limit
from specchat.doctor.plan import PairPlan, Routing
from specchat.doctor.report import render, render_described
from specchat.machine_links import read_links
from specchat.offload.placement import Placement
from specchat.plan import Machine
from specchat.plan.budget import Item, MemoryPlan
from specchat.plan.placement import Rooms


def pair_plan(placement: Placement, pass_s: float | None = None) -> PairPlan:
    items = (Item("device", "fixed parts", GB), Item("device", "target KV cache (5121 tokens)", GB // 2),
             Item("device", f"{placement.resident} resident decoder layers", placement.resident * GB // 10))
    memory = MemoryPlan(placement, 4096, None, items, Rooms(20 * GB, None, 100 * GB, "RAM (test)"), (), 1025)
    rates = None if pass_s is None else (8 / pass_s, 20 / pass_s)
    return PairPlan(memory, pass_s, rates)


RESIDENT = pair_plan(Placement((GB // 10,) * 28, resident=28, ram=0, disk=0, slots=0, slot_bytes=GB // 10,
                               needed=7 * GB))
STREAMED = pair_plan(Placement((GB // 10,) * 28, resident=10, ram=0, disk=18, slots=2, slot_bytes=GB // 10,
                               needed=5 * GB), pass_s=1.0)


IN_RAM = pair_plan(Placement((GB // 10,) * 28, resident=10, ram=18, disk=0, slots=2, slot_bytes=GB // 10,
                             needed=5 * GB), pass_s=0.15)


@pytest.mark.parametrize(
    ("pair", "cuda", "tier", "budget"),
    [
        (RESIDENT, False, "none", 16),  # every layer resident: small trees pay on a CPU
        (RESIDENT, True, "none", 256),  # a GPU scores hundreds of tokens for the price of a few
        (STREAMED, False, "disk", 256),  # layers stream: a pass costs their transfer, whatever the tree
        (IN_RAM, True, "ram", 1024),
    ],
)
def test_the_recommendation_follows_where_the_plan_puts_the_layers(pair, cuda, tier, budget):
    rec = advise(pair, cuda, ram_gbps=12.0, disk_gbps=1.8)
    assert (rec.tier, rec.budget) == (tier, budget)


def test_the_recommendation_names_the_planned_weights_and_the_transfer_cost():
    assert advise(RESIDENT, False, None, 1.8).reason == ("the weights (3.80 GB) fit in RAM (test); "
                                                       "on a CPU small trees pay")
    assert advise(RESIDENT, True, None, 1.8).reason == ("the weights (3.80 GB) fit in RAM (test); a GPU scores "
                                                      "hundreds of tokens for the price of a few")
    disk = advise(STREAMED, False, None, 1.8).reason
    assert disk.startswith("the weights (3.80 GB) do not: 10 of their 28 decoder layers fit in RAM (test); ")
    assert "streams 1.80 GB, ~1.00 s streaming per pass at 1.80 GB/s from disk" in disk and "flat in tree size" in disk
    in_ram = advise(IN_RAM, True, 12.0, 1.8).reason
    assert "streams 1.80 GB, ~0.15 s streaming per pass at 12.00 GB/s from RAM" in in_ram


def test_render_cpu_report_whole():
    limit = Limit(smallest=3 * GB, runtime=GB // 2)
    report = render(made_up_facts(), "qwen2.5-coder-1.5b", Recommendation("none", 16, "because"), RESIDENT, limit)
    assert report.splitlines() == [
        "devices",
        "  cpu            Test CPU (2 cores, 4 threads)",
        "  torch          2.9.0",
        "  cuda           no CUDA device",
        "memory",
        "  ram            32.00 GB total, 20.00 GB available",
        "  disk           100.00 GB free at /data/offload",
        "bandwidth",
        "  host->device   no CUDA: skipped",
        "  disk read      1.80 GB/s (O_DIRECT; 1.00 GB probe)",
        "recommendation",
        "  target         qwen2.5-coder-1.5b: 3.80 GB of weights as the plan holds them",  # 1 GB fixed, 28 x 0.1 GB
        "  offload        none",
        "  budget         16",
        "  why            because",
        "plan (--offload auto)",
        "  context        4096 tokens, no draft",
        "  RAM (test): 4.30 GB planned",
        "    fixed parts                                             1.00 GB",
        "    target KV cache (5121 tokens)                           0.50 GB",
        "    28 resident decoder layers                              2.80 GB",
        "  layers         28 resident, 0 in RAM, 0 on disk",
        "  ring           0 slots of 0.10 GB",
        "  per pass       0.00 GB streamed; no streaming: compute speed",
        "  expected       not estimated (nothing streams, or a link speed is unknown)",
        "memory limit",
        "  smallest       3.00 GB: the smallest memory limit (docker run --memory) the plan fits, every layer that "
        "does not fit streamed from the disk, specchat's runtime (0.50 GB: python, torch, transformers, the "
        "tokenizer) included (docs/memory.md)",
    ]
    nowhere = render(made_up_facts(), "t", None, "y", Limit(smallest=None, runtime=GB)).splitlines()
    assert nowhere[-2:] == ["memory limit", "  smallest       none: the pair fits under no memory limit here"]


def test_render_a_plan_that_streams_and_one_that_fits_nowhere():
    report = render(made_up_facts(disk_gbps=1.8), "t", Recommendation("disk", 256, "x"), STREAMED).splitlines()
    assert "  layers         10 resident, 0 in RAM, 18 on disk" in report
    assert "  ring           2 slots of 0.10 GB" in report
    assert "  per pass       1.80 GB streamed; ~1.00 s streaming per pass at 1.80 GB/s from disk" in report
    assert ("  expected       at most 8.0-20.0 tokens/s: 8-20 tokens per pass (SpecExec's offloaded 70B gen rates) "
            "over the streamed pass; drafting and compute come on top") in report  # no draft to time
    report = render(made_up_facts(), "t", None, "the model fits nowhere: y").splitlines()
    assert report[10:12] == ["recommendation", "  target         t: no plan fits this machine (below)"]
    assert not any(line.startswith("  offload ") for line in report)
    assert report[-2:] == ["plan (--offload auto)", "  fits nowhere   the model fits nowhere: y"]
    noted = replace(STREAMED, memory=replace(STREAMED.memory, notes=("int8 draft: smaller", "ring: 2 slots")))
    assert render(made_up_facts(), "t", Recommendation("disk", 256, "x"), noted).splitlines()[-2:] == [
        "  auto           int8 draft: smaller",
        "  auto           ring: 2 slots"]


def test_render_a_moe_plan_says_the_experts_a_pass_routes_to_by_tree_size():
    routing = Routing(experts=8, routed=2, touched=(2.0, 7.6, 8.0, 8.0), streamed=(0.5e9, 1.2e9, 1.25e9, 1.25e9))
    report = render(made_up_facts(), "t", Recommendation("disk", 256, "x"), replace(STREAMED, routing=routing))
    assert report.splitlines()[-2:] == [
        "  experts        2 of 8 a token; a pass over n tree tokens routes to ~(1: 2.0, 16: 7.6, 64: 8.0, 1024: 8.0) "
        "of them a layer",
        "  by expert      a streamed layer moves its head and the experts routed to: ~(1: 0.50, 16: 1.20, 64: 1.25, "
        "1024: 1.25) GB a pass",
    ]


def test_render_a_described_machine_says_what_describes_it():
    def heading(machine: Machine) -> list[str]:
        return render_described(machine, RESIDENT).splitlines()[:3]

    assert heading(Machine(vram_gb=24, ram_gb=64, pcie_gbps=25, disk_gbps=3.5)) == [
        "machine (described)", "  memory         24 GB GPU, 64 GB RAM", "  links          PCIe 25 GB/s, disk 3.5 GB/s"]
    assert heading(Machine(ram_gb=7.5)) == [
        "machine (described)", "  memory         no GPU, 7.5 GB RAM", "  links          not given"]
    assert render_described(Machine(ram_gb=7.5), RESIDENT).splitlines()[3] == "plan (--offload auto)"


def test_render_cuda_and_fallback():
    gpu = CudaDevice("Test GPU", 24 * GB, 20 * GB)
    facts = made_up_facts(cuda=(gpu,), h2d_gbps=12.5, direct=False)
    report = render(facts, "t", Recommendation("ram", 1024, "x"), RESIDENT)
    assert "  cuda:0         Test GPU: 24.00 GB total, 20.00 GB free" in report
    assert "12.50 GB/s (pinned memory)" in report
    assert "buffered + fadvise DONTNEED" in report


def test_render_says_why_a_gpu_it_sees_is_left_unused():
    report = render(made_up_facts(unused_gpu="the GPU here, Tesla T4 (compute capability 7.5), is older than ..."), "t",
                    Recommendation("disk", 256, "x"), STREAMED).splitlines()
    assert "  cuda           the GPU here, Tesla T4 (compute capability 7.5), is older than ..." in report
    assert "  host->device   no CUDA: skipped" in report


def test_doctor_command_end_to_end(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))  # where it keeps the measured links
    offload = tmp_path / "offload"
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--probe-gb", "0.01", "--offload-dir", str(offload))
    assert code == 0, out
    assert re.search(r"disk read +\d+\.\d\d GB/s \(", out)
    assert re.search(r"offload +(none|ram|disk)\n +budget +\d+", out)
    assert offload.is_dir() and not any(offload.iterdir())  # the probe file is gone
    # the draft's form as run would plan it here: int8 keeps dense copies for wide steps above the crossover
    # this machine measured (Draft.form), where it measured one
    form = r"\w+( with dense copies for wide steps)?"
    assert re.search(rf"plan \(--offload auto\)\n +context +4096 tokens, draft in {form}\n", out)
    assert re.search(r"^  layers +\d+ resident, \d+ in RAM, \d+ on disk$", out, re.M)
    measured = float(re.search(r"disk read +(\d+\.\d\d) GB/s", out).group(1))
    assert round(read_links().disk_gbps, 2) == measured  # the loading screen's expected pass time uses it


@pytest.fixture
def without_cuda(monkeypatch) -> None:
    """Doctor plans for this machine's GPU when it has one; a test asserting a CPU placement
    pretends it has none, so that it holds on a CUDA host too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_doctor_plans_under_a_ram_budget(monkeypatch, capsys, tmp_path, without_cuda):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    args = ["doctor", "--probe-gb", "0.01", "--offload-dir", str(tmp_path / "offload")]
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--ram-budget", "3")
    assert code == 0 and re.search(r"layers +\d+ resident, 0 in RAM, \d+ on disk", out)
    # 3 GB cannot hold 2.6 GB of layers beside 0.9 GB of fixed parts, the caches and the draft
    assert not re.search(r"layers +28 resident", out)
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--ram-budget", "0.5")
    assert code == 0 and re.search(r"fits nowhere   RAM under --ram-budget 0\.5 GB is [\d.]+ GB short: ", out)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--probe-gb", "0"), "--probe-gb must be between 0.001 and 1e+06 GB (got 0.0)"),
        (("--probe-gb", "-1"), "--probe-gb must be between"),
        (("--probe-gb", "1e-12"), "--probe-gb must be between"),  # no aligned bytes: a traceback
        (("--probe-gb", "1e300"), "--probe-gb must be between"),  # bytes past an int: a traceback
        (("--probe-gb", "nan"), "--probe-gb must be between"),
        (("--probe-gb", "5e5"), "needs"),  # more than the free disk space
        (("--ram-gb", "1e300", "--vram-gb", "24"), "--ram-gb must be a positive number up to 1e+06 (got 1e+300)"),
        (("--ram-budget", "0"), "--ram-budget must be in (0, 1e+06] (got 0.0)"),
        (("--offload-dir", "{tmp}/afile"), "is a file, not a directory"),
        (("--offload-dir", "{tmp}/afile/sub"), "afile/sub: cannot create it: Not a directory"),
    ],
)
def test_doctor_bad_arguments(monkeypatch, capsys, tmp_path, args, fragment):
    (tmp_path / "afile").write_text("x")
    args = [arg.format(tmp=tmp_path) for arg in args]
    if "--offload-dir" not in args:
        args += ["--offload-dir", str(tmp_path / "offload")]
    code, out, err = run_cli(monkeypatch, capsys, "doctor", *args)
    lines = err.splitlines()  # refused before measuring: no "measuring..." line first
    assert code == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err
