"""Measure each draft approximation's share of SpecExec's drafting cost, in one run.

Usage: python scripts/bench_draft_levers.py [--prompts 5] [--budget 16] [--max-new-tokens 64]
           [--temperature 0.6] [--dtype bfloat16] [--record docs/benchmarks.md]
The target is loaded once; the draft is loaded afresh per configuration (none, sub-vocabulary
head, int8 weights, both) and every configuration decodes the same MT-Bench first turns at the
same fixed budget and seed. Prints a markdown table (draft ms per iteration, draft steps, gen
rate, tokens/s, and each configuration's draft time against the plain draft's); --record appends
it with date, machine and command.
"""

import argparse
import shlex
import sys
from datetime import date

import torch

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.machine import describe_machine
from specchat.bench.measure import run_prompts
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.dtypes import DTYPES
from specchat.limits import FR_SPEC_VOCAB
from specchat.models.draft_approx import approximate_draft
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.runtime import encode_prompt
from specchat.summary import summarize

CONFIGURATIONS = {  # label: (int8 weights, head vocabulary or None for all)
    "plain draft": (False, None),
    "sub-vocabulary head": (False, FR_SPEC_VOCAB),
    "int8 weights": (True, None),
    "int8 + sub-vocabulary": (True, FR_SPEC_VOCAB),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--record", help="append the results to this markdown file")
    return parser.parse_args()


def draft_for(label: str, dtype: torch.dtype, stop_ids: frozenset[int]) -> CausalLM:
    int8, vocab = CONFIGURATIONS[label]
    loaded = load(DEFAULT_DRAFT, dtype, progress=False)
    return approximate_draft(loaded.model, loaded.tokenizer, loaded.directory, int8, vocab, stop_ids)


def measure(label: str, target: CausalLM, stop_ids: frozenset[int], prompts: list[list[int]], args) -> dict:
    draft = draft_for(label, DTYPES[args.dtype], stop_ids)
    engine = TreeEngine(SPECEXEC, target, draft, stop_ids, TreeShape(budget=args.budget))
    sampling = SamplingParams(args.temperature, args.top_p, args.seed)
    run_prompts(engine, prompts[:1], 8, sampling)  # warm-up: first-call allocations
    events, wall = run_prompts(engine, prompts, args.max_new_tokens, sampling)
    summary = summarize(events, wall)
    return {"label": label, "draft_ms": 1000 * summary.draft_s / summary.iterations,
            "target_ms": 1000 * summary.target_s / summary.iterations,
            "steps": sum(e.draft_steps for e in events) / len(events), "gen_rate": summary.gen_rate,
            "tokens_per_s": summary.tokens_per_s}


def table(rows: list[dict]) -> str:
    plain = rows[0]["draft_ms"]
    lines = ["| draft | draft ms / iter | vs plain | draft steps / iter | target ms / iter | gen rate | tokens/s |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['draft_ms']:.0f} | {r['draft_ms'] / plain:.2f}x | {r['steps']:.1f} | "
              f"{r['target_ms']:.0f} | {r['gen_rate']:.2f} | {r['tokens_per_s']:.2f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    target = load(DEFAULT_TARGET, DTYPES[args.dtype], progress=False)
    stop_ids = stop_token_ids(target.model, target.tokenizer)
    prompts = [encode_prompt(target.tokenizer, text, raw=False) for text in mtbench_first_turns(args.prompts)]
    rows = []
    for label in CONFIGURATIONS:
        rows.append(measure(label, CausalLM(target.model), stop_ids, prompts, args))
        print(f"{label}: draft {rows[-1]['draft_ms']:.0f} ms / iter", file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.record:
        command = "python scripts/bench_draft_levers.py " + shlex.join(sys.argv[1:])
        with open(args.record, "a") as out:
            out.write(f"\n{date.today()} · {describe_machine()} · `{command}`\n\n{text}\n")


if __name__ == "__main__":
    main()
