"""Measure SpecExec's generation rate (new tokens per target forward) on MT-Bench first turns.

Usage: python scripts/bench_gen_rate.py [--prompts 20] [--budgets 16,64,256,1024]
           [--max-new-tokens 64] [--temperature 0.6] [--top-p 0.9] [--dtype bfloat16]
           [--record docs/benchmarks.md]
       python scripts/bench_gen_rate.py --from-results docs/bench/genrate/results.jsonl
Prints a markdown table; with --record it also appends it, with date, machine and command.
--from-results measures nothing: it pools the per-prompt rows that the resumable
`specchat bench --engines specexec --out DIR` wrote, per budget, into the same table.
"""

import argparse
import shlex
import sys
from datetime import date
from pathlib import Path

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.machine import describe_machine
from specchat.bench.measure import measure_engine
from specchat.bench.report import pool
from specchat.bench.results import read_rows
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.dtypes import DTYPES
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.runtime import encode_prompt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--budgets", default="16,64,256,1024")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-depth", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--record", help="append the results to this markdown file")
    parser.add_argument("--from-results", type=Path, help="pool a bench results.jsonl instead of measuring")
    return parser.parse_args()


def measure(engine, prompts: list[list[int]], args, budget: int) -> dict:
    """Run every prompt at `budget`; pool the per-prompt figures over all their iterations."""
    engine.apply(LiveSettings(budget=budget))
    sampling = SamplingParams(args.temperature, args.top_p, args.seed)
    rows = [measure_engine(engine, prompt_ids, args.max_new_tokens, sampling) for prompt_ids in prompts]
    return {"budget": budget, **pool(rows)}


def table(rows: list[dict]) -> str:
    lines = [
        "| budget K | gen rate (tokens / target pass) | tokens/s | draft ms / iter | target ms / iter | mean tree | mean depth |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['budget']} | {r['gen_rate']:.2f} | {r['tokens_per_s']:.2f} | {r['draft_ms']:.0f} | "
            f"{r['target_ms']:.0f} | {r['tree']:.0f} | {r['depth']:.1f} |"
        )
    return "\n".join(lines)


# Rows pooled into one table must differ in budget and prompt only.
SHARED_SETTINGS = ("temperature", "top_p", "seed", "dataset", "max_new_tokens", "target", "draft", "dtype", "offload")


def pool_results(path: Path) -> list[dict]:
    """One table row per budget of the specexec rows in `path`, pooled over their prompts."""
    rows = [row for row in read_rows(path) if row["engine"] == "specexec"]
    settings = {tuple(row[name] for name in SHARED_SETTINGS) for row in rows}
    if len(settings) != 1:
        print(f"error: {path} must hold specexec rows of exactly one setting of {', '.join(SHARED_SETTINGS)}; "
              f"it holds {len(settings)}", file=sys.stderr)
        sys.exit(2)
    groups: dict[int, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["budget"], []).append(row)
    for budget, group in sorted(groups.items()):
        print(f"K={budget}: {len(group)} prompts", file=sys.stderr)
    return [{"budget": budget, **pool(group)} for budget, group in sorted(groups.items())]


def main() -> None:
    args = parse_args()
    if args.from_results:
        print(table(pool_results(args.from_results)))
        return
    dtype = DTYPES[args.dtype]
    target, draft = load(DEFAULT_TARGET, dtype), load(DEFAULT_DRAFT, dtype)
    engine = TreeEngine(
        SPECEXEC, CausalLM(target.model), CausalLM(draft.model), stop_token_ids(target.model, target.tokenizer),
        TreeShape(budget=16, max_depth=args.max_depth),
    )
    prompts = [encode_prompt(target.tokenizer, p, raw=False) for p in mtbench_first_turns(args.prompts)]
    if args.record:
        record_header(args)
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        rows.append(measure(engine, prompts, args, budget))
        row = table(rows[-1:]).splitlines()[-1]
        print(row, file=sys.stderr, flush=True)
        if args.record:  # row by row, so an interrupted sweep keeps what it measured
            with open(args.record, "a", encoding="utf-8") as handle:
                handle.write(row + "\n")
    print(table(rows))


def record_header(args: argparse.Namespace) -> None:
    header = (
        f"\n## SpecExec gen rate, {DEFAULT_TARGET} / {DEFAULT_DRAFT}, {date.today().isoformat()}\n\n"
        f"- Machine: {describe_machine()}\n- Command: `python {shlex.join(sys.argv)}`\n"
        f"- {args.prompts} MT-Bench first turns x {args.max_new_tokens} new tokens, "
        f"t={args.temperature}, top-p={args.top_p}, {args.dtype}, max depth {args.max_depth}\n\n"
    )
    with open(args.record, "a", encoding="utf-8") as handle:
        handle.write(header + "\n".join(table([]).splitlines()[:2]) + "\n")


if __name__ == "__main__":
    main()
