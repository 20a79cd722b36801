"""What the draft's sub-vocabulary head costs in acceptance: SpecExec's gen rate and draft steps
per iteration for each head size, on MT-Bench first turns, at fixed budgets.

Usage: python scripts/bench_draft_vocab.py [--prompts 5] [--vocabs 0,32768,16384] [--budgets 4,8]
           [--max-new-tokens 48]
Gen rate and draft steps do not depend on timing (a seed fixes the tokens), so this runs on a
busy machine too. 0 is the whole vocabulary. The target is loaded once, the draft once per head.
"""

import argparse

import torch

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.measure import run_prompts
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.draft_approx import approximate_draft
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.runtime import encode_prompt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--vocabs", default="0,32768,16384")
    parser.add_argument("--budgets", default="4,8")
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    target = load(DEFAULT_TARGET, torch.bfloat16, progress=False)
    stop_ids = stop_token_ids(target.model, target.tokenizer)
    prompts = [encode_prompt(target.tokenizer, text, raw=False) for text in mtbench_first_turns(args.prompts)]
    print("| head tokens | temperature | budget K | gen rate | draft steps / iter |\n|---|---|---|---|---|")
    for vocab in (int(v) for v in args.vocabs.split(",")):
        loaded = load(DEFAULT_DRAFT, torch.bfloat16, progress=False)
        draft = approximate_draft(loaded.model, loaded.tokenizer, loaded.directory, False, vocab or None, stop_ids)
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for budget in (int(k) for k in args.budgets.split(",")):
                engine = TreeEngine(SPECEXEC, CausalLM(target.model), draft, stop_ids, TreeShape(budget=budget))
                events, _ = run_prompts(engine, prompts, args.max_new_tokens, SamplingParams(temperature, 0.9, 0))
                tokens = sum(len(event.token_ids) for event in events)
                steps = sum(event.draft_steps for event in events) / len(events)
                print(f"| {vocab or 'all'} | {temperature:g} | {budget} | {tokens / len(events):.3f} | {steps:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
