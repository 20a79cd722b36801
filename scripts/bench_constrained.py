"""What a JSON schema costs a reply (issue 51): the embedded pair with the shipped defaults, each
prompt decoded with and without the schema in turn (the same process, the same models), printing
tokens/s, gen rate and accepted tokens per drafted tree for both, and the guide's cost per tree
node (the allowed-token mask of a node `depth` tokens below the root: consume, mask, roll back).

Usage: python scripts/bench_constrained.py [--prompts 4] [--max-new-tokens 64] [--temperature 0.6]
"""

import argparse
import json
from dataclasses import replace
from time import perf_counter

from specchat.decoding.events import SamplingParams
from specchat.loader import load_models
from specchat.engine_options import EngineOptions
from specchat.runtime import encode_prompt
from specchat.summary import summarize, tree_means

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "year": {"type": "integer"},
    "facts": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
    "required": ["name", "year", "facts"], "additionalProperties": False}
PROMPTS = (
    "Describe the Python programming language as JSON: its name, the year it appeared and a few facts.",
    "Describe the Rust programming language as JSON: its name, the year it appeared and a few facts.",
    "Describe the Linux kernel as JSON: its name, the year it appeared and a few facts.",
    "Describe the HTTP protocol as JSON: its name, the year it appeared and a few facts.",
)
MASK_DEPTHS = (0, 4, 12)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.6)
    return parser.parse_args()


def decode(engine, prompt_ids: list[int], tokens: int, sampling: SamplingParams) -> dict:
    start = perf_counter()
    events = list(engine.generate(prompt_ids, tokens, sampling))
    summary = summarize(events, perf_counter() - start)
    return {"tokens": summary.new_tokens, "seconds": summary.wall_s, "iterations": summary.iterations,
            "accepted_per_tree": tree_means(events).accepted, "trees": tree_means(events).trees}


def mask_cost_us(guide, tokens: list[int], depth: int, repeats: int = 200) -> float:
    """Microseconds of one node's mask `depth` tokens below the root (the reply's own tokens)."""
    path = [tokens[:depth]] * repeats
    start = perf_counter()
    guide.allowed(path)
    return 1e6 * (perf_counter() - start) / repeats


def main() -> None:
    args = parse_args()
    models = load_models(EngineOptions(), progress=False)
    engine = models.engine("specexec")
    grammar = models.grammars().json_schema(SCHEMA)
    sampling = SamplingParams(temperature=args.temperature)
    rows = []
    for index, prompt in enumerate(PROMPTS[:args.prompts]):
        prompt_ids = encode_prompt(models.tokenizer, prompt, raw=False)
        for form in ("free", "schema"):
            engine.forget()  # each reply prefills its prompt: the two forms pay alike
            guided = replace(sampling, guide=grammar.start()) if form == "schema" else sampling
            row = {"prompt": index, "form": form, **decode(engine, prompt_ids, args.max_new_tokens, guided)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    guide = grammar.start()
    reply = [t for e in engine.generate(encode_prompt(models.tokenizer, PROMPTS[0], raw=False), 32,
                                        replace(sampling, guide=guide)) for t in e.token_ids]
    costs = {depth: mask_cost_us(grammar.start(), reply, depth) for depth in MASK_DEPTHS if depth <= len(reply)}
    print("| form | tokens/s | gen rate | accepted per tree |\n|---|---|---|---|")
    for form in ("free", "schema"):
        mine = [row for row in rows if row["form"] == form]
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
        iterations, trees = sum(r["iterations"] for r in mine), sum(r["trees"] for r in mine)
        accepted = sum(r["accepted_per_tree"] * r["trees"] for r in mine) / max(trees, 1)
        print(f"| {form} | {tokens / seconds:.2f} | {tokens / iterations:.2f} | {accepted:.2f} |")
    print("mask per tree node, us (depth below the root): " +
          ", ".join(f"{depth}: {cost:.0f}" for depth, cost in costs.items()))
    models.close()


if __name__ == "__main__":
    main()
