"""`generate --trace`: the reply's iterations past the first three, each a profiler step holding
its named spans, written as a Chrome trace; a file that cannot be written is refused in one line."""

import gzip
import json

import pytest
import torch

from specchat.errors import SpecchatError
from specchat.tracing import SKIPPED_ITERATIONS, TRACED_ITERATIONS, check_trace_path, span, traced_reply


def reply(iterations: int, path) -> None:
    """A stand-in reply: each iteration a span holding one product, then the step."""
    with traced_reply(path) as iteration_done:
        for _ in range(iterations):
            with span("draft"):
                torch.ones(8, 8) @ torch.ones(8, 8)
            iteration_done()


def names(path) -> list[str]:
    with gzip.open(path, "rt") as file:
        return [event.get("name", "") for event in json.load(file)["traceEvents"]]


def test_the_iterations_past_the_skipped_ones_are_written(tmp_path):
    path = tmp_path / "reply.json.gz"
    reply(SKIPPED_ITERATIONS + TRACED_ITERATIONS + 2, path)
    written = names(path)
    steps = [name for name in written if name.startswith("ProfilerStep#")]
    assert steps == [f"ProfilerStep#{n}" for n in range(SKIPPED_ITERATIONS, SKIPPED_ITERATIONS + TRACED_ITERATIONS)]
    assert written.count("specchat.draft") == TRACED_ITERATIONS


def test_a_reply_within_the_skipped_iterations_records_no_span(tmp_path):
    path = tmp_path / "reply.json.gz"
    reply(SKIPPED_ITERATIONS, path)
    assert not path.exists() or "specchat.draft" not in names(path)


def test_without_a_path_nothing_is_written(tmp_path):
    reply(SKIPPED_ITERATIONS + 2, None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, words", [("folder", "is a folder"), ("missing/reply.json", "does not exist"),
                                          ("reply.txt", "name a .json or .json.gz file")])
def test_a_file_that_cannot_be_written_is_refused_in_one_line(tmp_path, name, words):
    (tmp_path / "folder").mkdir()
    with pytest.raises(SpecchatError, match=words):
        check_trace_path(tmp_path / name)


def test_a_writable_name_passes(tmp_path):
    check_trace_path(tmp_path / "reply.json")
    check_trace_path(tmp_path / "reply.json.gz")
