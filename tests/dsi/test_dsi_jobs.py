"""DSI's commit rule (dsi/jobs.py) on hand-built token lists: which jobs are live, which build on
a rejected draft, and which target tokens a finished job commits."""

import pytest
from helpers.engines import GREEDY

from specchat.dsi.jobs import VerifyJob, builds_on_rejected, decided_tokens, is_live

COMMITTED = [1, 2, 3, 4, 5]  # prompt and committed tokens: the frontier is position 5


def job(drafts: list[int]) -> VerifyJob:
    """A job sent when COMMITTED was committed: its drafts start at position 5."""
    return VerifyJob(0, tuple(COMMITTED + drafts), len(COMMITTED), GREEDY)


def test_job_geometry() -> None:
    j = job([6, 7])
    assert j.tokens == (1, 2, 3, 4, 5, 6, 7)
    assert (j.first, j.last, j.drafts) == (5, 7, 2)
    assert (job([]).last, job([]).drafts) == (5, 0)


@pytest.mark.parametrize(
    "committed,live",
    [
        (COMMITTED, True),  # sent at the frontier
        (COMMITTED + [6], True),  # its first draft was committed
        (COMMITTED + [6, 7], True),  # frontier at its bonus position: it still decides that token
        (COMMITTED + [9], False),  # its first draft was rejected
        (COMMITTED + [6, 9], False),  # its second draft was rejected
        (COMMITTED + [6, 7, 8], False),  # every draft committed, but the frontier passed its bonus
    ],
)
def test_is_live(committed, live) -> None:
    assert is_live(job([6, 7]), committed) is live


def test_zero_draft_job_is_live_only_at_its_frontier() -> None:
    assert is_live(job([]), COMMITTED)
    assert not is_live(job([]), COMMITTED + [6])


@pytest.mark.parametrize(
    "committed,rejected",
    [
        (COMMITTED, False),  # nothing decided beyond `first` yet
        (COMMITTED + [6], False),
        (COMMITTED + [6, 7], False),
        (COMMITTED + [6, 7, 8, 9], False),  # passed by the frontier, every draft accepted: not rejected
        (COMMITTED + [9], True),
        (COMMITTED + [6, 9], True),
        (COMMITTED + [6, 9, 8, 7], True),
    ],
)
def test_builds_on_rejected(committed, rejected) -> None:
    assert builds_on_rejected(job([6, 7]), committed) is rejected


def test_passed_job_is_dead_but_not_rejected() -> None:
    """The engine cancels both kinds, but counts only the rejected ones as preempted."""
    passed = COMMITTED + [6, 7, 8]
    assert not is_live(job([6, 7]), passed) and not builds_on_rejected(job([6, 7]), passed)
    rejected = COMMITTED + [6, 8]
    assert not is_live(job([6, 7]), rejected) and builds_on_rejected(job([6, 7]), rejected)


def test_all_drafts_accepted_decides_drafts_and_bonus() -> None:
    targets = [6, 7, 8, 10]  # positions 5..8; the target agrees with every draft
    assert decided_tokens(job([6, 7, 8]), targets, COMMITTED, stop_ids=()) == [6, 7, 8, 10]


def test_first_draft_rejected_decides_one_token() -> None:
    assert decided_tokens(job([6, 7, 8]), [11, 7, 8, 10], COMMITTED, stop_ids=()) == [11]


def test_later_draft_rejected_decides_through_the_correction() -> None:
    # targets agree at 5 and 6, not at 7; what the target says after (12) is conditioned on the wrong 8
    assert decided_tokens(job([6, 7, 8]), [6, 7, 13, 12], COMMITTED, stop_ids=()) == [6, 7, 13]


def test_zero_draft_job_decides_the_target_token() -> None:
    assert decided_tokens(job([]), [42], COMMITTED, stop_ids=()) == [42]


@pytest.mark.parametrize(
    "stop_ids,expected",
    [
        ({7}, [6, 7]),  # an accepted draft that is a stop token ends the reply
        ({6}, [6]),
        ({10}, [6, 7, 8, 10]),  # the bonus
        ({13}, [6, 7, 8, 10]),  # a stop id that never occurs
    ],
)
def test_decided_tokens_stop_at_a_stop_id(stop_ids, expected) -> None:
    assert decided_tokens(job([6, 7, 8]), [6, 7, 8, 10], COMMITTED, stop_ids) == expected


def test_rejection_at_a_stop_token_stops_there() -> None:
    assert decided_tokens(job([6, 7, 8]), [6, 99, 8, 10], COMMITTED, stop_ids={99}) == [6, 99]


def test_job_behind_the_frontier_decides_nothing() -> None:
    targets = [6, 7, 8]
    assert decided_tokens(job([6, 7]), targets, COMMITTED + [6, 7, 8], stop_ids=()) == []
    assert decided_tokens(job([6, 7]), targets, COMMITTED + [6, 9], stop_ids=()) == []  # built on a rejected draft


def test_job_sent_before_the_frontier_decides_from_the_frontier_on() -> None:
    j = job([6, 7, 8])  # first = 5
    targets = [6, 7, 8, 10]  # positions 5..8
    # another job already committed 6 and 7: this one adds only what lies beyond
    assert decided_tokens(j, targets, COMMITTED + [6], stop_ids=()) == [7, 8, 10]
    assert decided_tokens(j, targets, COMMITTED + [6, 7], stop_ids=()) == [8, 10]
    assert decided_tokens(j, targets, COMMITTED + [6, 7, 8], stop_ids=()) == [10]
    # from the frontier on it still stops at its first rejected draft
    assert decided_tokens(j, [6, 7, 14, 10], COMMITTED + [6], stop_ids=()) == [7, 14]


def test_target_token_before_the_frontier_is_not_reused() -> None:
    """targets[0] (position 5) differs from the committed 6 only in a corrupted reply; the frontier
    token comes from targets[frontier - first] all the same."""
    assert decided_tokens(job([6, 7]), [99, 7, 8], COMMITTED + [6], stop_ids={99}) == [7, 8]
