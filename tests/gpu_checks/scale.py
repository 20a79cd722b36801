"""`gpu_check.sh --scale`: the paper's premise at the paper's scale. A Llama-2-70B-GPTQ-shaped
target of random 4-bit weights (a few of its 80 layers), streamed from pinned RAM through a ring
smaller than a pass, must pass a 2048-token tree in about the time of one token (the link, not the
int4 products, bounds both); then the products per linear at its shapes, a Llama-2-7B-shaped
draft's step per width, a Mixtral-8x7B-GPTQ-shaped target's passes streamed by expert and as whole
layers, int4_gemm's blocks, and the draft's step profiled kernel by kernel. `--dry-run` runs the same code over shrunk widths on any device, the CPU
included, and gives no verdicts."""

from pathlib import Path

import torch
from gpu_checks.scale_gemm import GEMM_ALIAS, gemm_rows, gemm_shrink, gemm_table, layer_table, layer_uses
from gpu_checks.scale_draft import draft_rows, draft_table, draft_verdict
from gpu_checks.scale_linears import linear_rows, linear_table, linear_verdict
from gpu_checks.scale_models import alias_config, write_random_4bit
from gpu_checks.scale_moe import MOE_ALIAS, moe_rows, moe_table
from gpu_checks.scale_passes import pass_rows, pass_table, pass_verdict
from gpu_checks.scale_profile import profile_rows, profile_tables, target_pass, target_pass_table
from gpu_checks.scale_sizes import DRAFT_ALIAS, PARTS, SLOTS, TARGET_ALIAS, ScaleSizes
from gpu_checks.verdict import Verdict, exit_code

from specchat.quant.fp8 import fp8_runs_on


def say(text: str) -> None:
    print(text, flush=True)


def describe(sizes: ScaleSizes, device: torch.device) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"
    shrunk = f" (dry run, shrunk: {sizes.target_shrink})" if sizes.dry_run else ""
    return (f"scale check on {where}, torch {torch.__version__}: {TARGET_ALIAS} shaped target{shrunk}, "
            f"{sizes.layers} layers streamed through {SLOTS} slots, {sizes.cached} cached tokens")


def verdict_line(verdict: Verdict) -> str:
    return f"{verdict.status}  {verdict.check}: {verdict.detail}"


def run_scale(sizes: ScaleSizes, device: torch.device, workdir: Path, parts: tuple[str, ...] = PARTS) -> int:
    """Print the tables of `parts` and their verdicts; 1 when a verdict failed."""
    say(describe(sizes, device))
    runs = {"passes": target_passes, "linears": target_linears, "draft": draft_steps, "moe": moe_passes,
            "gemm": gemm_blocks, "profile": draft_profile}
    verdicts = [verdict for part in PARTS if part in parts for verdict in runs[part](sizes, device, workdir)]
    return exit_code(verdicts)


def target_passes(sizes: ScaleSizes, device: torch.device, workdir: Path) -> list[Verdict]:
    config, settings = alias_config(TARGET_ALIAS, sizes.layers, sizes.target_shrink)
    say(f"writing a random 4-bit GPTQ checkpoint of {sizes.layers} layers ...")
    directory = write_random_4bit(config, settings, workdir / "target")
    passes = pass_rows(directory, device, workdir, sizes, config.vocab_size, say)
    say(pass_table(passes))
    return [said(pass_verdict(passes, sizes.dry_run))]


def target_linears(sizes: ScaleSizes, device: torch.device, workdir: Path) -> list[Verdict]:
    config, settings = alias_config(TARGET_ALIAS, sizes.layers, sizes.target_shrink)
    say("timing one linear of each shape ...")
    linears = linear_rows(config, settings, sizes.linear_rows, device)
    say(linear_table(linears))
    return [said(linear_verdict(linears, device, sizes.dry_run))]


def draft_steps(sizes: ScaleSizes, device: torch.device, workdir: Path) -> list[Verdict]:
    say(f"timing one linear of each of a {DRAFT_ALIAS} shaped draft's shapes, rounded to 4 bits ...")
    draft_config, _ = alias_config(DRAFT_ALIAS, 1, sizes.draft_shrink)
    say(linear_table(linear_rows(draft_config, None, sizes.draft_widths, device)))
    say(f"timing a {DRAFT_ALIAS} shaped bf16 draft of {sizes.draft_layers} layers ...")
    drafts = draft_rows(sizes, device)
    say(draft_table(drafts))
    verdicts = [said(draft_verdict(drafts, sizes.dry_run))]
    say("the same draft rounded to 4 bits (--draft-quant int4) ...")
    say(draft_table(draft_rows(sizes, device, "int4")))
    if fp8_runs_on(device) or device.type == "cpu":  # a CPU runs it as the tests do (quant/fp8.py)
        say("the same draft in fp8 (--draft-quant fp8) ...")
        fp8 = draft_rows(sizes, device, "fp8")
        say(draft_table(fp8))
        verdicts.append(said(draft_verdict(fp8, sizes.dry_run, "fp8")))
    return verdicts


def moe_passes(sizes: ScaleSizes, device: torch.device, workdir: Path) -> list[Verdict]:
    say(f"a {MOE_ALIAS} shaped target streamed by expert and as whole layers:")
    say(moe_table(moe_rows(sizes, device, workdir, say)))
    return []


def gemm_blocks(sizes: ScaleSizes, device: torch.device, workdir: Path) -> list[Verdict]:
    say(f"int4_gemm's blocks swept at a {GEMM_ALIAS} shaped draft's linears ...")
    rows = gemm_rows(sizes, device)
    say(gemm_table(rows))
    say("a decoder layer's linears, per input rows:")
    say(layer_table(rows, layer_uses(alias_config(GEMM_ALIAS, 1, gemm_shrink(sizes))[0])))
    return []


def draft_profile(sizes: ScaleSizes, device: torch.device, workdir: Path) -> list[Verdict]:
    say(f"profiling a {DRAFT_ALIAS} shaped bf16 draft's step, prepared as a loaded draft is, kernel by kernel ...")
    say(profile_tables(profile_rows(sizes, device)))
    say(f"profiling a {TARGET_ALIAS} shaped target layer's tree pass: its memory and its attention's kernels ...")
    say(target_pass_table(target_pass(sizes, device)))
    return []


def said(verdict: Verdict) -> Verdict:
    say(verdict_line(verdict))
    return verdict
