"""summarize() figures and JSON-ready event records."""

import json

import pytest

from specchat.decoding.events import IterationEvent
from specchat.summary import Summary, TreeMeans, event_record, summarize, tree_means


def event(tokens: list[int], draft_s: float = 0.0, target_s: float = 0.0, transfer_s: float = 0.0, **kw) -> IterationEvent:
    return IterationEvent(
        token_ids=tokens, accepted=max(len(tokens) - 1, 0), tree_size=8, depth=3,
        draft_s=draft_s, target_s=target_s, transfer_s=transfer_s, **kw,
    )


EVENTS = [
    event([1, 2, 3], draft_s=0.1, target_s=0.5, transfer_s=0.25, prefill_tokens=40, prefill_s=0.3),
    event([4], draft_s=0.2, target_s=0.25, pass_s=0.2),
    event([5, 6], draft_s=0.3, target_s=0.25, transfer_s=0.5, finished=True),
]


def test_summarize_figures() -> None:
    summary = summarize(EVENTS, wall_s=2.0)
    assert summary.new_tokens == 6
    assert summary.iterations == 3
    assert summary.gen_rate == pytest.approx(2.0)  # 6 tokens / 3 target forwards
    assert summary.tokens_per_s == pytest.approx(3.0)
    assert summary.draft_s == pytest.approx(0.6)
    assert summary.target_s == pytest.approx(1.0)
    assert summary.transfer_s == pytest.approx(0.75)
    assert summary.wall_s == 2.0
    assert (summary.prefill_tokens, summary.prefill_s) == (40, 0.3)  # the first event's
    assert summary.pass_s == pytest.approx(0.2)


def test_summarize_zero_iterations() -> None:
    assert summarize([], wall_s=0.0) == Summary(
        new_tokens=0, iterations=0, gen_rate=0.0, tokens_per_s=0.0,
        draft_s=0.0, target_s=0.0, transfer_s=0.0, transfer_bytes=0, stall_s=0.0, wall_s=0.0,
    )
    assert summarize([], wall_s=1.5).tokens_per_s == 0.0


def test_summarize_zero_wall_time_does_not_divide() -> None:
    summary = summarize(EVENTS, wall_s=0.0)
    assert summary.tokens_per_s == 0.0
    assert summary.gen_rate == pytest.approx(2.0)


def test_event_with_no_tokens_counts_as_an_iteration() -> None:
    summary = summarize([event([]), event([9, 9])], wall_s=1.0)
    assert (summary.new_tokens, summary.iterations, summary.gen_rate) == (2, 2, 1.0)


def test_event_record_is_json_round_trippable() -> None:
    original = event([3, 1, 4], draft_s=0.01, target_s=0.02, transfer_bytes=1024, finished=True,
                     draft_steps=5)
    record = event_record(original)
    assert json.loads(json.dumps(record)) == record
    assert record["token_ids"] == [3, 1, 4]
    assert record["transfer_bytes"] == 1024
    assert record["finished"] is True
    assert record["draft_steps"] == 5
    assert IterationEvent(**record) == original


def test_event_record_does_not_alias_the_event() -> None:
    original = event([1, 2], draft_steps=1)
    record = event_record(original)
    record["token_ids"].append(99)
    assert original.token_ids == [1, 2]


def test_summarize_streaming_figures() -> None:
    events = [event([1], transfer_s=0.5, transfer_bytes=10**9, stall_s=0.1),
              event([2], transfer_s=1.5, transfer_bytes=3 * 10**9, stall_s=0.2)]
    summary = summarize(events, wall_s=3.0)
    assert summary.transfer_bytes == 4 * 10**9
    assert summary.stall_s == pytest.approx(0.3)
    assert summary.transfer_gbps == pytest.approx(2.0)
    assert summarize([event([1])], wall_s=1.0).transfer_gbps == 0.0


def test_link_idle_is_weighted_by_each_iteration_time() -> None:
    events = [event([1], draft_s=1.0, target_s=1.0, link_idle=0.5), event([2], draft_s=0.5, target_s=1.5, link_idle=0.0),
              event([3], draft_s=3.0, target_s=1.0, link_idle=0.25)]
    # (0.5 * 2 + 0 * 2 + 0.25 * 4) / 8 s
    assert summarize(events, wall_s=8.0).link_idle == pytest.approx(0.25)
    assert json.loads(json.dumps(event_record(events[0])))["link_idle"] == 0.5


def test_tree_means_leave_out_the_prompts_pass() -> None:
    prompt_pass = IterationEvent(token_ids=[9], accepted=0, tree_size=0, depth=0, draft_s=0.0, target_s=0.4)
    assert tree_means([prompt_pass, *EVENTS]) == TreeMeans(trees=3, tree_size=8, depth=3, accepted=1)
    assert tree_means([prompt_pass]) == TreeMeans(trees=0, tree_size=0, depth=0, accepted=0)
