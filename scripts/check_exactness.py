"""Exactness acceptance on the real embedded pair in float32.

1. Greedy SpecExec == transformers `generate(do_sample=False)` at several budgets.
2. Seeded SpecExec (t=0.6, top-p 0.9) == seeded autoregressive sampling.
Both are judged by tests/helpers/exactness.py: a divergence passes only when the engine's token is
itself near-tied at that prefix, then the comparison re-anchors and goes on to the end; at most
one tie per prompt. Every row prints its tie count.

Usage: python scripts/check_exactness.py [--prompts 5] [--max-new-tokens 64]
           [--budgets 8,64,256] [--sampled-budget 64] [--record docs/benchmarks.md]
Exits 1 if any check fails.
"""

import argparse
import shlex
import sys
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checker lives with the tests
from helpers.exactness import Comparison, ExactnessCheck, hf_greedy  # noqa: E402

from specchat.bench.datasets import mtbench_first_turns
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.runtime import encode_prompt

GREEDY = SamplingParams(0.0, 1.0, 0)


def row(check: str, budget: int, index: int, tokens: list[int], iterations: int, result: Comparison) -> str:
    return (f"| {check} | K={budget} | prompt {index} | {len(tokens)} tokens, {iterations} iterations | "
            f"{len(result.ties)} | {result.describe()} |")


def tokens_of(engine, prompt_ids: list[int], n: int, sampling: SamplingParams) -> tuple[list[int], int]:
    events = list(engine.generate(prompt_ids, n, sampling))
    return [t for e in events for t in e.token_ids], len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description="Exactness acceptance on the real pair (float32).")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", default="8,64,256")
    parser.add_argument("--sampled-budget", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--record")
    args = parser.parse_args()

    target_model, draft_model = load(DEFAULT_TARGET, torch.float32), load(DEFAULT_DRAFT, torch.float32)
    target, draft = CausalLM(target_model.model), CausalLM(draft_model.model)
    tokenizer = target_model.tokenizer
    stops = stop_token_ids(target_model.model, tokenizer)
    prompts = [encode_prompt(tokenizer, p, raw=False) for p in mtbench_first_turns(args.prompts)]
    n = args.max_new_tokens
    checker = ExactnessCheck(target, stops, n)
    lines: list[str] = []
    results: list[Comparison] = []

    references = [hf_greedy(target, ids, n, stops, tokenizer.pad_token_id) for ids in prompts]
    for budget in (int(b) for b in args.budgets.split(",")):
        engine = TreeEngine(SPECEXEC, target, draft, stops, TreeShape(budget=budget))
        for index, (ids, reference) in enumerate(zip(prompts, references)):
            tokens, iterations = tokens_of(engine, ids, n, GREEDY)
            result = checker.compare(ids, reference, tokens, GREEDY)
            results.append(result)
            lines.append(row("greedy vs HF generate", budget, index, tokens, iterations, result))
            print(lines[-1], flush=True)

    sampling = SamplingParams(0.6, 0.9, args.seed)
    autoregressive = AutoregressiveEngine(target, stops)
    specexec = TreeEngine(SPECEXEC, target, draft, stops, TreeShape(budget=args.sampled_budget))
    for index, ids in enumerate(prompts):
        reference, _ = tokens_of(autoregressive, ids, n, sampling)
        tokens, iterations = tokens_of(specexec, ids, n, sampling)
        result = checker.compare(ids, reference, tokens, sampling)
        results.append(result)
        lines.append(row("seeded t=0.6 p=0.9 vs autoregressive", args.sampled_budget, index, tokens, iterations, result))
        print(lines[-1], flush=True)

    failures = sum(not result.acceptable for result in results)
    summary = f"{failures} failure(s), {sum(len(result.ties) for result in results)} tie(s)"
    print(summary)
    if args.record:
        header = (
            f"\n## Exactness on the real pair (float32), {date.today().isoformat()}\n\n"
            f"- Command: `python {shlex.join(sys.argv)}`\n"
            f"- {args.prompts} MT-Bench first turns x {n} new tokens; {summary}\n\n"
            "| check | budget | prompt | run | ties | result |\n|---|---|---|---|---|---|\n"
        )
        with open(args.record, "a", encoding="utf-8") as handle:
            handle.write(header + "\n".join(lines) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
