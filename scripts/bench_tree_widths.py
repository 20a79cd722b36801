"""Steps and rows a draft tree runs: real trees beside `gpu_check --pair`'s ranked ones, on the
embedded pair. The pair check times the draft over ranked trees (the j-th child of an expansion
scores -j), which fill the budget at max_depth whatever random weights predict; this says how
many steps, and rows a step, a real tree of the same budget runs instead.

    python scripts/bench_tree_widths.py [--prompts 3] [--max-new-tokens 32] [--budgets 256,1024]
        [--batches 256,64] [--ranked-tokens 6] [--record docs/benchmarks.md]

Per budget (and expansion batch: nodes a step expands, by default a fixed budget's max(16, K/8)),
greedy SpecExec (bf16, depth 24) over MT-Bench first turns, then ranked trees at the same shape over
the first prompt. A row: trees, tokens a tree (gen rate), the draft's forwards a tree (its catch-up,
whose row gives the root's children, and its steps: the pair check's "draft steps"), rows a tree's
steps ran (each expanded node one), rows a step.
"""

import argparse
import shlex
import sys
from dataclasses import dataclass, replace
from datetime import date

import torch

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.machine import describe_machine
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
MAX_DEPTH = 24  # the pair check's and the default's


class CountedDraft(CausalLM):
    """A draft that counts the rows of its tree steps (those with a tree mask; a catch-up has none)."""

    rows: int = 0

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None = None):
        if mask is not None:
            self.rows += tokens.numel()
        return super().hidden(tokens, positions, cache, mask)


@dataclass(frozen=True)
class Widths:
    trees: int
    tokens: int  # emitted by the tree iterations
    steps: int  # the draft's forwards, as events and the pair check count them: a tree's catch-up and its steps
    rows: int  # of its tree steps

    def row(self, label: str) -> str:
        tree_steps = max(self.steps - self.trees, 1)
        return (f"| {label} | {self.trees} | {self.tokens / self.trees:.2f} | {self.steps / self.trees:.1f} "
                f"| {self.rows / self.trees:.0f} | {self.rows / tree_steps:.0f} |")


def tree_widths(target: CausalLM, draft: CausalLM, stop_ids: list[int], shape: TreeShape, prompts: list[list[int]],
                max_new_tokens: int) -> Widths:
    """The trees SpecExec grows over `prompts` at `shape`, greedy: their count, tokens, steps and rows."""
    counted = CountedDraft(draft.model, draft.stream, draft.vocab, draft.head, draft.capacity)
    engine = TreeEngine(SPECEXEC, target, counted, stop_ids, shape)
    trees = tokens = steps = 0
    for prompt in prompts:
        for event in engine.generate(prompt, max_new_tokens, GREEDY):
            if event.tree_size:
                trees, tokens, steps = trees + 1, tokens + len(event.token_ids), steps + event.draft_steps
    if trees == 0:
        raise SystemExit("no tree was drafted: give more --max-new-tokens")
    return Widths(trees, tokens, steps, counted.rows)


def table(rows: list[str]) -> str:
    header = ["| trees | count | tokens a tree | the draft's forwards a tree | rows a tree | rows a step |",
              "|---|---|---|---|---|---|"]
    return "\n".join(header + rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--budgets", default="256,1024")
    parser.add_argument("--batches",
                        help="expansion batches to grow each budget's trees at (default: a fixed budget's, tree.py)")
    parser.add_argument("--ranked-tokens", type=int, default=6, help="new tokens of the ranked trees' reply")
    parser.add_argument("--record", help="append the table to this markdown file")
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    batches = [] if args.batches is None else [int(b) for b in args.batches.split(",")]
    if min(args.prompts, args.max_new_tokens, args.ranked_tokens, *budgets, *batches) < 1:
        parser.error("--prompts, --max-new-tokens, --ranked-tokens, every budget and batch are at least 1")
    args.budgets, args.batches = budgets, batches or [None]
    return args


def main() -> None:
    args = parse_args()
    target, draft = load(DEFAULT_TARGET, torch.bfloat16), load(DEFAULT_DRAFT, torch.bfloat16)
    stop_ids = stop_token_ids(target.model, target.tokenizer)
    pair = CausalLM(target.model), CausalLM(draft.model)
    prompts = [encode_prompt(target.tokenizer, p, raw=False) for p in mtbench_first_turns(args.prompts)]
    rows = []
    for budget, batch in [(budget, batch) for budget in args.budgets for batch in args.batches]:
        shape = TreeShape(budget, MAX_DEPTH, batch=batch)
        label = f"budget {budget}" + ("" if batch is None else f", batch {batch}")
        real = tree_widths(*pair, stop_ids, shape, prompts, args.max_new_tokens)
        rows.append(real.row(f"real, {label}"))
        print(rows[-1], file=sys.stderr, flush=True)
        ranked = tree_widths(*pair, stop_ids, replace(shape, ranked_tree=True), prompts[:1], args.ranked_tokens)
        rows.append(ranked.row(f"ranked, {label}"))
        print(rows[-1], file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.record:
        with open(args.record, "a", encoding="utf-8") as out:
            out.write(f"\n{date.today()} · {describe_machine()} · `python {shlex.join(sys.argv)}`\n\n{text}\n")


if __name__ == "__main__":
    main()
