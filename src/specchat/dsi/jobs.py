"""Verification jobs and the rule that turns their target tokens into committed tokens.

A job carries the sequence as the drafter saw it when the job was sent: the committed tokens
(the first `first` of them) followed by d drafts. A worker returns the target's token for every
position first .. first + d, each sampled from the target's distribution given the job's own
tokens before that position, at the position's seeded uniform (decoding/sampling.py).

Why only target tokens are ever emitted, and why they are exact: the target's token at position
n is valid iff the job's tokens before n equal the committed ones. It holds at the frontier when
the job is live (its drafts up to the frontier were all committed); committing the target's
token t at n keeps it true for n + 1 iff the job's draft at n is t. So a job decides positions
from the frontier up to its first rejected draft, and every committed token is the target's
sample given the committed prefix, the token sequential decoding emits.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from specchat.decoding.events import SamplingParams


class Preempted(Exception):
    """Raised inside a worker when its running job is cancelled."""


@dataclass(frozen=True)
class VerifyJob:
    id: int
    tokens: tuple[int, ...]  # committed prefix + drafts, as sent
    first: int  # the frontier when sent: the first position the job returns a target token for
    sampling: SamplingParams

    @property
    def last(self) -> int:
        """The last position the job decides: its bonus token after the last draft."""
        return len(self.tokens)

    @property
    def drafts(self) -> int:
        return len(self.tokens) - self.first


def is_live(job: VerifyJob, committed: Sequence[int]) -> bool:
    """The job can still decide the token at the frontier: it reaches it, and every draft of it
    before the frontier was committed (tokens before `first` were committed when it was sent)."""
    frontier = len(committed)
    return job.last >= frontier and list(job.tokens[job.first:frontier]) == list(committed[job.first:frontier])


def builds_on_rejected(job: VerifyJob, committed: Sequence[int]) -> bool:
    """Some draft of the job differs from the committed token at its position."""
    end = min(len(job.tokens), len(committed))
    return list(job.tokens[job.first:end]) != list(committed[job.first:end])


def decided_tokens(job: VerifyJob, targets: Sequence[int], committed: Sequence[int],
                   stop_ids: Collection[int]) -> list[int]:
    """The target tokens of a finished job that extend `committed`, in order: from the frontier
    through the first position whose draft the target rejects, a stop token, or the job's end."""
    if not is_live(job, committed):
        return []
    decided = []
    for position in range(len(committed), job.last + 1):
        token = targets[position - job.first]
        decided.append(token)
        if token in stop_ids or position == job.last or job.tokens[position] != token:
            break
    return decided
