"""`gpu_check.sh --scale` on this CPU: its --dry-run runs the whole scale check over shrunk widths
(so that the code a GPU runs cannot rot between GPU runs), and its verdicts and trees are right."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gpu_checks.scale_draft import DraftRow, draft_verdict
from gpu_checks.scale_gemm import GEMM_ALIAS, GemmRow, block_grid, layer_table, named
from gpu_checks.scale_linears import VERDICT_ROWS, VERDICT_SHAPE, LinearRow, linear_verdict
from gpu_checks.scale_models import alias_config, write_random_4bit
from gpu_checks.scale_passes import PassRow, pass_verdict
from gpu_checks.tree_passes import random_parents, random_tree
from helpers.scripts import load_script
from safetensors.torch import load_file

from specchat.quant.gemm_blocks import blocks_for

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
DRY_RUN_TIMEOUT_S = 120


def test_the_dry_run_prints_every_table_on_the_cpu_without_a_verdict():
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # a venv off PATH; the CPU's view
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--scale", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=DRY_RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("scale check on the CPU")
    for tokens in (1, 16, 64):  # the passes', the draft's in bf16, int4 and fp8, the MoE target's, int4_gemm's layer's
        assert sum(line.startswith(f"| {tokens} | ") for line in lines) == (5 if tokens == 64 else 6), done.stdout
    assert "the same draft rounded to 4 bits (--draft-quant int4) ..." in lines
    assert "the same draft in fp8 (--draft-quant fp8) ..." in lines
    headers = [index for index, line in enumerate(lines) if line.startswith("| tree tokens n | ms a layer |")]
    bf16, rounded, fp8 = (lines[index + 2:index + 5] for index in headers)  # each draft's rows, after its header
    # bf16 beside the same weights as transformers builds them; the rounded and fp8 drafts alone
    assert [line.endswith(" | n/a |") for line in bf16 + rounded + fp8] == [False] * 3 + [True] * 6, done.stdout
    split = lines.index("timing one linear of each of a llama-2-7b shaped draft's shapes, rounded to 4 bits ...")
    target, draft = lines[:split], lines[split:lines.index(f"int4_gemm's blocks swept at a {GEMM_ALIAS} shaped "
                                                            "draft's linears ...")]
    for shape in ("256x256", "256x64", "256x512", "512x256"):  # the target's linears
        assert sum(line.startswith(f"| {shape} | ") for line in target) == 3, done.stdout
    # then the draft's (4 heads of 64, no grouped attention: k and v are 256x256 too), no kernel to time on a CPU
    assert sum(line.startswith("| 256x256 | 16 | ") for line in draft) == 2
    assert all(line.endswith(" | n/a |") for line in draft if line.startswith("| 256x"))
    assert sum("dry run: no verdict" in line for line in lines) == 4  # the pass's, the product's, the draft steps'
    assert "Traceback" not in done.stderr
    # the MoE target's one-token pass streamed by expert moves a layer's head and 2 of its 8 experts
    moe = lines[[i for i, line in enumerate(lines) if "streamed by expert and as whole layers" in line][0]:]
    one = [float(cell) for cell in next(line for line in moe if line.startswith("| 1 | ")).strip("| ").split(" | ")]
    assert one[2] < 0.5 * one[4]


def test_a_random_tree_is_a_tree_with_its_mask_and_positions():
    parents = random_parents(200, torch.Generator().manual_seed(1))
    assert parents[0] == -1 and all(0 <= parent < node for node, parent in enumerate(parents) if node)
    tree = random_tree(5, 3, 100)
    assert tree.mask.shape == (5, 8) and tree.mask[:, :3].all() and tree.mask[:, 3:].diagonal().all()
    assert tree.positions[0] == 3 and not tree.mask[0, 4:].any()  # the root sees the prefix and itself


def passes(one: float, widest: float) -> list[PassRow]:
    return [PassRow(1, one, one, 8.0), PassRow(2048, widest, widest, 8.0)]


def test_the_pass_verdict_holds_up_to_the_bound_and_gives_none_in_a_dry_run():
    assert pass_verdict(passes(8.0, 9.6), dry_run=False).status == "PASS"
    failed = pass_verdict(passes(7.1, 120.1), dry_run=False)  # issue 36's H200 run
    assert failed.status == "FAIL" and failed.detail.startswith("16.92 ")
    dry = pass_verdict(passes(1.0, 3.0), dry_run=True)
    assert dry.status == "SKIP" and dry.detail.startswith("dry run: no verdict")


def row(wide_ms: float | None, shape: tuple[int, int] = VERDICT_SHAPE) -> LinearRow:
    return LinearRow(shape, VERDICT_ROWS, 16.3, wide_ms, 0.609)


def test_the_product_verdict_reads_the_wide_path_at_its_shape_and_width():
    assert linear_verdict([row(0.95)], CPU, dry_run=False).status == "PASS"
    assert linear_verdict([row(1.6)], CPU, dry_run=False).status == "FAIL"
    assert linear_verdict([row(0.95, (8192, 8192))], CPU, dry_run=False).detail.startswith("not measured")
    assert linear_verdict([row(None)], torch.device("cuda"), dry_run=False).status == "FAIL"
    assert linear_verdict([row(0.95)], CPU, dry_run=True).status == "SKIP"


def linear_words(directory: Path, layer: int) -> dict[str, torch.Tensor]:
    tensors = load_file(directory / f"model-{layer:05d}.safetensors")
    return {name.split(".")[-2]: tensor for name, tensor in tensors.items() if name.endswith("_proj.qweight")}


@pytest.mark.parametrize("alias", ["llama-2-70b-gptq", "llama-3.1-70b-awq"])
def test_random_checkpoints_draw_each_linear_or_one_draw_a_shape(tmp_path, alias):
    """The scale check compares streamed logits with the model's, so its layers must differ; the pair
    check only times its pair, and one draw a shape halves its writing."""
    config, settings = alias_config(alias, 2, {"hidden_size": 256, "intermediate_size": 512,
                                               "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 64})
    for distinct in (True, False):
        directory = write_random_4bit(config, settings, tmp_path / str(distinct), distinct=distinct)
        first, second = linear_words(directory, 0), linear_words(directory, 1)
        assert sorted(first) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
        same = [name for name in first if torch.equal(first[name], second[name])]
        assert same == ([] if distinct else list(first))
        assert torch.equal(second["q_proj"], second["o_proj"]) != distinct  # 256 x 256 both


def test_the_draft_verdict_reads_the_captured_step_up_to_256_tokens():
    # head 0.2 ms; a captured layer 0.3 ms: 9.8 ms a step; the 1024-token row is past the bound's widths
    rows = [DraftRow(1, 1.5, 0.2, 0.3), DraftRow(256, 1.5, 0.2, 0.3), DraftRow(1024, 9.0, 0.5, 2.0)]
    held = draft_verdict(rows, dry_run=False)
    assert held.status == "PASS" and held.detail.startswith("9.80 ms at most")
    rows[1] = DraftRow(256, 1.5, 0.2, 0.31)  # 10.12 ms
    assert draft_verdict(rows, dry_run=False).detail.startswith("10.12 ms at most (256 tokens)")
    assert draft_verdict(rows, dry_run=False).status == "FAIL"
    assert draft_verdict(rows, dry_run=True).status == "SKIP"


def dry_run_parts(parts: str, monkeypatch, capsys) -> list[str]:
    """The lines `gpu_check.py --scale --dry-run --parts PARTS` prints on the CPU (on a CUDA host too),
    run in this process (the dry run whole goes through the shell script above)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_script("gpu_check").main(["--scale", "--dry-run", "--parts", parts]) == 0
    return capsys.readouterr().out.splitlines()


def test_parts_run_only_the_tables_they_name(monkeypatch, capsys):
    lines = dry_run_parts("moe,linears", monkeypatch, capsys)
    said = [line for line in lines if line.startswith(("timing", "writing", "a mixtral"))]
    assert said[0] == "timing one linear of each shape ..." and said[1].startswith("a mixtral-8x7b-gptq shaped target")
    assert not any("draft" in line for line in said) and sum("dry run: no verdict" in line for line in lines) == 1


def test_the_profile_names_the_ops_of_a_prepared_drafts_step_per_width(monkeypatch, capsys):
    """On the CPU its ops' CPU time (the draft is prepared for the run's device, the CPU): its
    products among them, and the step's time in all no less than the rows shown; then a target
    layer's pass, its memory peak not measured without CUDA's allocator."""
    lines = dry_run_parts("profile", monkeypatch, capsys)
    # the draft's steps at 1 and 64 tokens, then the target layer's pass over 64
    assert [line for line in lines if line.endswith("tree tokens:")] == ["1 tree tokens:", "64 tree tokens:",
                                                                          "64 tree tokens:"]
    first = lines[lines.index("1 tree tokens:") + 3:lines.index("64 tree tokens:")]
    rows = [line.strip("| ").split(" | ") for line in first if line.startswith("| aten::")]
    assert any(name == "aten::addmm" or name == "aten::mm" for name, *_ in rows), first
    total = next(line for line in first if line.startswith("| every kernel, in all"))
    assert float(total.split(" | ")[1]) >= sum(float(cells[1]) for cells in rows) - 0.01 * len(rows)
    target = next(line for line in lines if line.startswith("a llama-2-70b-gptq shaped layer's pass over 64 tree"))
    assert "after 32: n/a (no CUDA allocator)" in target and target.endswith(" MB for such a pass")
    assert lines[lines.index(target) + 1] == "64 tree tokens:"  # its ops, as a step's


def test_the_gemm_sweep_runs_the_kernel_under_the_interpreter_and_prints_both_tables():
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--scale", "--dry-run", "--parts", "gemm"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=DRY_RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    products = [line.split(" | ") for line in lines if line.startswith("| 256x") or line.startswith("| 512x")]
    assert [(cells[0], cells[1]) for cells in products] == [
        (f"| {shape}", rows) for shape in ("256x256", "256x512", "512x256") for rows in ("1", "16")]
    assert all(float(cells[4]) > 0 and cells[5].endswith("4 warps, 3 stages") for cells in products), done.stdout
    layer = lines[lines.index("a decoder layer's linears, per input rows:") + 3:]
    assert [line.split(" | ")[0] for line in layer] == ["| 1", "| 16"] and "n/a" not in "".join(layer)


def test_the_sweep_tries_taller_blocks_more_warps_and_stages_where_steps_compute():
    """At 256 rows the grid's 64-row blocks over 4 warps ran at a fifth of dense bf16's speed on
    an H200: the sweep there also tries 128-row blocks, 8 warps and 4 stages; at 64 rows it does not."""
    wide, narrow = block_grid(256, dry_run=False), block_grid(64, dry_run=False)
    assert wide[0] == blocks_for(256) and len(set(wide)) == len(wide)
    assert {b.rows for b in wide} == {64, 128} and {b.warps for b in wide} == {4, 8} and {b.stages for b in wide} == {3, 4}
    assert {(b.rows, b.warps, b.stages) for b in narrow} == {(64, 4, 3)}


def test_the_layer_table_picks_the_blocks_fastest_over_the_layer_not_over_one_linear():
    first = blocks_for(1)  # the table's blocks_for column
    second = replace(first, splits=first.splits + 1)
    uses = {(64, 64): 2, (64, 256): 1}
    rows = [GemmRow((64, 64), 1, 1.0, 1.0, {first: 1.0, second: 2.0}),  # first wins here, used twice a layer
            GemmRow((64, 256), 1, 1.0, 1.0, {first: 5.0, second: 0.5})]  # a layer: first 2 + 5, second 4 + 0.5
    table = layer_table(rows, uses).splitlines()
    assert table[2] == f"| 1 | {named(second)} | 4.500 | 7.000 | 3.000 | 3.000 |"  # fused, dense: 2 + 1
