"""What a predicted output gains an edit (OpenAI's `prediction`): the embedded pair with the shipped
defaults, each edit request decoded without and with the original code as its prediction, in turn
(the same process, the same models, each reply prefilling its prompt), printing tokens/s,
iterations and accepted tokens per tree for both, whether the two replies are the same tokens (they
must be: the prediction only adds a chain to each tree), and the ratio of the rates.

Usage: python scripts/bench_prediction.py [--edits 3] [--max-new-tokens 160] [--temperature 0]
"""

import argparse
import json
from dataclasses import replace
from time import perf_counter

from specchat.decoding.events import SamplingParams
from specchat.decoding.prediction import Prediction
from specchat.engine_options import EngineOptions
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
    return parser.parse_args()


def decode(engine, prompt_ids: list[int], tokens: int, sampling: SamplingParams) -> tuple[list[int], dict]:
    start = perf_counter()
    events = list(engine.generate(prompt_ids, tokens, sampling))
    summary, means = summarize(events, perf_counter() - start), tree_means(events)
    return [t for e in events for t in e.token_ids], {
        "tokens": summary.new_tokens, "seconds": summary.wall_s, "iterations": summary.iterations,
        "accepted_per_tree": means.accepted, "trees": means.trees}


def main() -> None:
    args = parse_args()
    models = load_models(EngineOptions(), progress=False)
    engine = models.engine("specexec")
    sampling = SamplingParams(temperature=args.temperature)
    rows = []
    for index, (ask, code) in enumerate(zip(ASKS[:args.edits], CODE)):
        prompt_ids = encode_prompt(models.tokenizer, f"{ask}\n\n```python\n{code}```", raw=False)
        predicted = tuple(models.tokenizer.encode(f"```python\n{code}```", add_special_tokens=False))
        replies = {}
        for form in ("plain", "predicted"):
            engine.forget()  # each reply prefills its prompt: the two pay alike
            asked = replace(sampling, prediction=Prediction(predicted)) if form == "predicted" else sampling
            replies[form], row = decode(engine, prompt_ids, args.max_new_tokens, asked)
            rows.append({"edit": index, "form": form, **row})
            print(json.dumps(rows[-1]), flush=True)
        print(json.dumps({"edit": index, "same_tokens": replies["plain"] == replies["predicted"]}), flush=True)
    print("| form | tokens/s | tokens an iteration | accepted per tree |\n|---|---|---|---|")
    rates = {}
    for form in ("plain", "predicted"):
        mine = [row for row in rows if row["form"] == form]
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
        iterations, trees = sum(r["iterations"] for r in mine), sum(r["trees"] for r in mine)
        accepted = sum(r["accepted_per_tree"] * r["trees"] for r in mine) / max(trees, 1)
        rates[form] = tokens / seconds
        print(f"| {form} | {rates[form]:.2f} | {tokens / iterations:.2f} | {accepted:.2f} |")
    print(f"predicted / plain: {rates['predicted'] / rates['plain']:.2f}x")
    models.close()


if __name__ == "__main__":
    main()
