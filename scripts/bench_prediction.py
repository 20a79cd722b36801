"""What a predicted output gains (OpenAI's `prediction`, and the code a chat message or a
`generate` prompt quotes): the embedded pair with the shipped defaults, each request decoded in
turn plain, with the original code as its prediction (an editor's request), and with the code the
message quotes (the chat's and `generate`'s, reached only once the reply quotes it), in the same
process, each reply prefilling its prompt. The requests: edits, whose replies repeat the code, and
explanations of the same code, whose replies mostly do not. Prints tokens/s, iterations, accepted
tokens and nodes per tree, and the draft's and target's seconds per kind and form, whether every
form gave the plain reply's tokens (in bfloat16 a different tree may break a near-tie the other
way: counted, not failed), and the rates' ratios to plain.

With `--offload disk --resident-layers 0` the target streams every layer from the disk each pass,
where a pass costs most and tokens a pass count the most.

Usage: python scripts/bench_prediction.py [--edits 3] [--max-new-tokens 160] [--temperature 0]
                                          [--offload auto|none|ram|disk] [--resident-layers N]
"""

import argparse
import json
from dataclasses import replace
from time import perf_counter

from specchat.decoding.events import SamplingParams
from specchat.decoding.prediction import Prediction, quoted_prediction
from specchat.engine_options import EngineOptions
from specchat.limits import DEFAULT_OFFLOAD, OFFLOAD_TIERS
from specchat.loader import load_models
from specchat.runtime import encode_prompt
from specchat.summary import summarize, tree_means

CODE = (
    '''def mean_and_spread(values):
    """The mean of the values and their standard deviation."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    total = 0.0
    for value in values:
        total += value
    mean = total / n
    squares = 0.0
    for value in values:
        squares += (value - mean) ** 2
    return mean, (squares / n) ** 0.5
''',
    '''def read_settings(path):
    settings = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    return settings
''',
    '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        self.counts[word] = self.counts.get(word, 0) + 1

    def most_common(self, k):
        ranked = sorted(self.counts.items(), key=lambda item: -item[1])
        return ranked[:k]
''',
)
EXPLAIN = "Explain what this code does in a few sentences."
ASKS = (
    "Rename the variable `n` to `count` in this function. Reply with the whole function in one Python code "
    "block and nothing else.",
    "Make this function skip lines that start with `;` as well as `#`. Reply with the whole function in one "
    "Python code block and nothing else.",
    "Add a docstring to the class and to each method. Reply with the whole class in one Python code block and "
    "nothing else.",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=len(ASKS), choices=range(1, len(ASKS) + 1))
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--offload", choices=OFFLOAD_TIERS, default=DEFAULT_OFFLOAD)
    parser.add_argument("--resident-layers", type=int, default=None)
    return parser.parse_args()


def decode(engine, prompt_ids: list[int], tokens: int, sampling: SamplingParams) -> tuple[list[int], dict]:
    start = perf_counter()
    events = list(engine.generate(prompt_ids, tokens, sampling))
    summary, means = summarize(events, perf_counter() - start), tree_means(events)
    return [t for e in events for t in e.token_ids], {
        "tokens": summary.new_tokens, "seconds": summary.wall_s, "iterations": summary.iterations,
        "accepted_per_tree": means.accepted, "trees": means.trees, "tree_size": round(means.tree_size, 1),
        "draft_s": round(summary.draft_s, 3), "target_s": round(summary.target_s, 3)}


FORMS = ("plain", "predicted", "quoted")


def prediction_of(form: str, tokenizer, message: str, code: str) -> Prediction | None:
    if form == "predicted":
        return Prediction(tuple(tokenizer.encode(f"```python\n{code}```", add_special_tokens=False)))
    return quoted_prediction(message, tokenizer) if form == "quoted" else None


def report(rows: list[dict]) -> None:
    """A table row per kind and form, then each form's rate against plain's, per kind."""
    print("| kind | form | tokens/s | tokens an iteration | accepted per tree | nodes per tree | draft / target s |\n"
          "|---|---|---|---|---|---|---|")
    rates = {}
    for kind in ("edit", "explain"):
        for form in FORMS:
            mine = [row for row in rows if row["kind"] == kind and row["form"] == form]
            tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
            iterations, trees = sum(r["iterations"] for r in mine), sum(r["trees"] for r in mine)
            accepted = sum(r["accepted_per_tree"] * r["trees"] for r in mine) / max(trees, 1)
            nodes = sum(r["tree_size"] * r["trees"] for r in mine) / max(trees, 1)
            draft_s, target_s = sum(r["draft_s"] for r in mine), sum(r["target_s"] for r in mine)
            rates[kind, form] = tokens / seconds
            print(f"| {kind} | {form} | {rates[kind, form]:.2f} | {tokens / iterations:.2f} | {accepted:.2f} "
                  f"| {nodes:.1f} | {draft_s:.2f} / {target_s:.2f} |")
    for kind in ("edit", "explain"):
        print(f"{kind}: " + ", ".join(f"{form} / plain {rates[kind, form] / rates[kind, 'plain']:.2f}x"
                                      for form in FORMS[1:]))


def main() -> None:
    args = parse_args()
    models = load_models(EngineOptions(offload=args.offload, resident_layers=args.resident_layers), progress=False)
    engine = models.engine("specexec")
    sampling = SamplingParams(temperature=args.temperature)
    requests = [("edit", ask, code) for ask, code in zip(ASKS[:args.edits], CODE)]
    requests += [("explain", EXPLAIN, code) for code in CODE[:args.edits]]
    rows = []
    for index, (kind, ask, code) in enumerate(requests):
        message = f"{ask}\n\n```python\n{code}```"
        prompt_ids = encode_prompt(models.tokenizer, message, raw=False)
        replies = {}
        for form in FORMS:
            engine.forget()  # each reply prefills its prompt: the forms pay alike
            asked = replace(sampling, prediction=prediction_of(form, models.tokenizer, message, code))
            replies[form], row = decode(engine, prompt_ids, args.max_new_tokens, asked)
            rows.append({"request": index, "kind": kind, "form": form, **row})
            print(json.dumps(rows[-1]), flush=True)
        same = {form: replies[form] == replies["plain"] for form in FORMS[1:]}
        print(json.dumps({"request": index, "kind": kind, "same_tokens": same}), flush=True)
    report(rows)
    models.close()


if __name__ == "__main__":
    main()
