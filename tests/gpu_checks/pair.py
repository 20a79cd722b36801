"""`gpu_check.sh --pair`: the mission's command at the paper's scale, end to end through the CLI.
Each alias pair (gpu_checks/pair_models.py) is written with random weights, all of its layers, then
`specchat generate --json` runs it (plan, load, pin, stream, draft, verify) at each budget with
ranked trees (random weights accept nothing: a ranked tree fills its budget and depth whatever the
draft predicts), under a 24 GB --vram-budget so that the target streams as on a consumer card; the
pair is removed before the next one is written, so that a 64 GB disk holds it. `--dry-run` shrinks
layers and widths and runs the same code on the CPU (the suite runs it), with no verdicts."""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from gpu_checks.pair_aliases import PAIRS, PairAliases
from gpu_checks.pair_models import prompt_words, write_model
from gpu_checks.pair_rows import BudgetRow, budget_row, pair_table, passes_line, plan_line, row_line
from gpu_checks.pair_verdicts import pair_verdicts
from gpu_checks.verdict import Verdict, exit_code, judged, table

from specchat.doctor.plan import doctor_options, doctor_plan
from specchat.machine_choices import kept_choices
from specchat.offload.placement import Placement
from specchat.plan.machine import Machine
from specchat.trace_summary import read_trace, summary_text
from specchat.tracing import SKIPPED_ITERATIONS, TRACED_ITERATIONS

CARD = Machine(vram_gb=24, ram_gb=64, pcie_gbps=25)  # the consumer card the projection is for
PROMPT_WORDS = 64
WHOLE_HEAD = 0  # --draft-vocab's whole head (generate says why)
PROBE_GB = 0.25  # doctor's disk probe: the disk tier's speed, which a 24 GB budget on a large host does not use
TRACE_KERNELS = 12  # the kernels a traced reply's summary lists a span
# doctor's lines the check shows: the links it measured (kept for generate's plan), the placement,
# and the draft's form auto chose with each form's predicted iteration
DOCTOR_LINES = ("  host->device", "  disk read", "  context", "  layers", "  per pass", "  auto")


@dataclass(frozen=True)
class PairSizes:
    budgets: tuple[int, ...]
    new_tokens: int  # a reply's: the prompt's pass, then trees
    max_depth: int
    offload: tuple[str, ...]  # generate's placement options
    target_layers: int | None = None  # None: the alias's own
    draft_layers: int | None = None
    shrink: dict = field(default_factory=dict)  # config overrides of both models: empty at the paper's sizes
    doctor: tuple[str, ...] = ()  # doctor's options that plan as generate's offload options do
    warm_trees: int = 0  # a reply's first trees, left out of its means (pair_rows.budget_row)
    also: tuple[str, ...] = ()  # generate's options of a second reply at each budget, its row beside (--also)
    trace_also: bool = False  # the traced reply takes the `also` options (--trace-also)

    @property
    def dry_run(self) -> bool:
        return bool(self.shrink)


# the judged budget first: a command cut short at its limit has printed its row
FULL_PAIR = PairSizes(budgets=(1024, 128, 2048), new_tokens=10, max_depth=24, warm_trees=2,
                      offload=("--offload", "auto", "--vram-budget", "24"), doctor=("--vram-budget", "24"))
# groups of 128 inputs (AWQ's) fit hidden 256 and MLP 512; begin and end ids inside the 512 words
DRY_PAIR = PairSizes(budgets=(16,), new_tokens=4, max_depth=4, offload=("--offload", "disk", "--resident-layers", "1"),
                     target_layers=3, draft_layers=2,
                     shrink={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
                             "num_key_value_heads": 1, "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2})


def say(text: str) -> None:
    print(text, flush=True)


def run_pair(sizes: PairSizes, device: torch.device, workdir: Path, only: str | None = None,
             traces: Path | None = None) -> int:
    """Every pair's (or the pair of the target `only`'s) table, placement and verdicts, then the
    verdicts' table; 1 when one failed. With `traces`, a folder: each pair's traced reply there too."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"
    say(f"pair check on {where}, torch {torch.__version__}" + (f" (dry run, shrunk: {sizes.shrink})" if sizes.dry_run
                                                              else ""))
    say(f"each row: means over a reply's trees past its first {sizes.warm_trees} (warm-up: kernels compiled, "
        "widths timed, the draft's steps captured)")
    verdicts = []
    for aliases in PAIRS:
        if only in (None, aliases.target):
            verdicts += check_pair(aliases, sizes, device, workdir, traces)
    say(table(verdicts))
    return exit_code(verdicts)


def check_pair(aliases: PairAliases, sizes: PairSizes, device: torch.device, workdir: Path,
               traces: Path | None = None) -> list[Verdict]:
    say(f"writing {aliases.target} and {aliases.draft} with random weights ...")
    start = time.monotonic()
    target = write_model(aliases.target, sizes.target_layers, sizes.shrink, workdir / "target", device)
    draft = write_model(aliases.draft, sizes.draft_layers, sizes.shrink, workdir / "draft", device)
    os.sync()  # on the disk before anything is timed: ~50 GB written back would share the host with the first reply
    say(f"written in {time.monotonic() - start:.0f} s")
    rows = []
    try:
        say(doctor(target, draft, sizes, workdir))
        for budget in sizes.budgets:
            rows.append(budget_row(budget, generate(target, draft, budget, sizes, workdir), sizes.warm_trees))
            say_row(aliases, rows[-1], sizes, device, workdir)
            if sizes.also:
                also = budget_row(budget, generate(target, draft, budget, sizes, workdir, sizes.also), sizes.warm_trees)
                say_row(aliases, also, sizes, device, workdir, f"budget {budget} with {' '.join(sizes.also)}")
        if traces is not None:
            say(traced(target, draft, sizes, workdir, traces / f"trace-{aliases.target}-{sizes.budgets[0]}.json.gz"))
    except (RuntimeError, ValueError) as failure:  # the reason is the verdict's detail
        return [judged(f"{aliases.target}: generate", False, str(failure))]
    finally:
        shutil.rmtree(target)
        shutil.rmtree(draft)
    say(gemm_served())
    say(expansion_served())
    rows.sort(key=lambda row: row.budget)
    card = card_placement(aliases, ran_quant(rows[-1], device), workdir)
    say(pair_table(rows, card.pass_bytes))
    say(plan_line(rows[-1], card.resident, card.pass_bytes))
    return pair_verdicts(aliases.target, rows, card.pass_bytes, sizes.dry_run)


def traced(target: Path, draft: Path, sizes: PairSizes, workdir: Path, trace: Path) -> str:
    """One more reply at the first budget (the judged one, unless --budgets) under `generate
    --trace` (its figures in no row: the profiler slows what it records), long enough for the
    iterations traced, summed up per span and kernel (scripts/trace_summary.py)."""
    budget = sizes.budgets[0]
    new_tokens = max(sizes.new_tokens, SKIPPED_ITERATIONS + TRACED_ITERATIONS + 1)
    options = (*(sizes.also if sizes.trace_also else ()), "--trace", str(trace))
    try:
        record = generate(target, draft, budget, replace(sizes, new_tokens=new_tokens), workdir, options)
    except RuntimeError as failure:  # the rows and verdicts stand without it
        return f"budget {budget}: the traced reply failed: {failure}"
    ran = len(record["iterations"])
    if ran <= SKIPPED_ITERATIONS:  # its trees accepted enough to end within the iterations warming up
        return f"budget {budget}: traced nothing: the reply ended after {ran} iterations"
    summary = summary_text(read_trace(trace), ("draft", "pass"), TRACE_KERNELS)
    traced_with = f" with {' '.join(sizes.also)}" if sizes.trace_also else ""
    return f"budget {budget}{traced_with}, traced in {trace.name}:\n{summary}"


def gemm_served() -> str:
    """The widths at which the draft's 4-bit linears ran int4_gemm's kernel, as the replies' probes
    kept them (widths.gemm_span: "int4 gemm rows" a shape), so that a run says whether it did."""
    spans = by_shape("int4 gemm rows", lambda span: "never" if span is None else f"{span[0]}-{span[1]} rows")
    return "int4_gemm served " + (", ".join(spans) or "nothing: no 4-bit draft linear on CUDA was probed")


def expansion_served() -> str:
    """From how many rows the 4-bit linears (the target's; a 4-bit draft's too) ran CUDA's
    expansion rather than the fused kernel, as the replies' probes kept it ("int4 expansion
    rows" a shape, measured at a shape's first product, while the first reply streamed)."""
    spans = by_shape("int4 expansion rows", lambda rows: "never" if rows in (None, math.inf) else f"from {rows} rows")
    return "int4 expansion served " + (", ".join(spans) or "nothing: no 4-bit linear on CUDA was probed")


def by_shape(choice: str, words: Callable[[object], str]) -> list[str]:
    """Each kept `choice` of a linear's shape, "IxO dtype: `words`(its value)", and whether it
    was measured under load."""
    return [f"{kept.key['in_features']}x{kept.key['out_features']} {kept.key['dtype'].removeprefix('torch.')}: "
            f"{words(kept.value)}" + (" (measured under load)" if kept.busy else "")
            for kept in kept_choices() if kept.choice == choice]


def ran_quant(row: BudgetRow, device: torch.device) -> str:
    """The draft's form the card is planned with: the one that ran on a GPU; a CPU's run (the dry
    run) drafts in a CPU's form (int8), so the card is then planned as auto plans it."""
    return row.plan["draft_quant"] if device.type == "cuda" else "auto"


def say_row(aliases: PairAliases, row: BudgetRow, sizes: PairSizes, device: torch.device, workdir: Path,
            label: str | None = None) -> None:
    """One budget's row, placement and passes as soon as it ran (a command cut short at its limit
    keeps them), each line after `label` ("budget N", or what --also's reply ran with)."""
    label = label or f"budget {row.budget}"
    card = card_placement(aliases, ran_quant(row, device), workdir)
    say(f"{label}: {row_line(row, card.pass_bytes)}")
    for line in plan_line(row, card.resident, card.pass_bytes).splitlines():  # why the draft's form, where chosen
        say(f"{label}: {line}")
    say(f"{label}: {passes_line(row, sizes.warm_trees)}")


def card_placement(aliases: PairAliases, draft_quant: str, workdir: Path) -> Placement:
    """The described 24 GB card's placement of the pair with the draft as it ran here (its form,
    its whole head: the logits it reserves cost the H200's run 2 resident layers), so that the
    projection's pass and its measured draft steps are of one plan."""
    options = replace(doctor_options(aliases.target, aliases.draft, None, workdir), draft_quant=draft_quant,
                      draft_vocab=WHOLE_HEAD)
    return doctor_plan(options, CARD).memory.placement


def doctor(target: Path, draft: Path, sizes: PairSizes, workdir: Path) -> str:
    """`specchat doctor` on the written pair as generate will plan it: it measures the links (kept
    for generate's plan) and, on a GPU, each draft form's step, then says which form auto chose and
    why; its DOCTOR_LINES. RuntimeError with its last line of stderr when it fails."""
    command = [sys.executable, "-m", "specchat", "doctor", "--target", str(target), "--draft", str(draft),
               "--offload-dir", str(workdir / "layers"), "--probe-gb", str(PROBE_GB), *sizes.doctor]
    start = time.monotonic()
    done = run_checked(command, "doctor")
    shown = [line for line in done.stdout.splitlines() if line.startswith(DOCTOR_LINES)]
    return "\n".join([f"doctor ({time.monotonic() - start:.0f} s):", *shown])


def generate(target: Path, draft: Path, budget: int, sizes: PairSizes, workdir: Path,
             extra: tuple[str, ...] = ()) -> dict:
    """`specchat generate --json`'s record of one greedy reply at `budget` (with `extra` options);
    RuntimeError with its last line of stderr when it fails."""
    command = [sys.executable, "-m", "specchat", "generate", prompt_words(PROMPT_WORDS), "--raw", "--json",
               "--temperature", "0", "--max-new-tokens", str(sizes.new_tokens), "--target", str(target),
               "--draft", str(draft), "--budget", str(budget), "--max-depth", str(sizes.max_depth), "--ranked-tree",
               # the whole head: a device carries no corpus to rank a sub-vocabulary on, and a step with the
               # whole head costs at least what it would with part of it (the step's verdict is not eased)
               "--draft-vocab", str(WHOLE_HEAD),
               "--offload-dir", str(workdir / "layers"), *sizes.offload, *extra]
    say(f"budget {budget}: specchat generate ...")
    start = time.monotonic()
    done = run_checked(command, f"budget {budget}: generate")
    say(f"budget {budget}: exited {done.returncode} after {time.monotonic() - start:.0f} s (load included)")
    return json.loads(done.stdout)


def run_checked(command: list[str], what: str) -> subprocess.CompletedProcess:
    """`command` run offline; RuntimeError "`what` exited N: its last line of stderr" when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"{what} exited {done.returncode}: {lines[-1] if lines else ''}")
    return done

