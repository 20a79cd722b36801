"""A check's verdict, and the table of verdicts the GPU check prints (Markdown, so that it can go
into docs/benchmarks.md as it is)."""

from dataclasses import dataclass
from typing import Literal

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Verdict:
    check: str
    status: Status
    detail: str  # what was measured against which bound, or why the check was skipped


def judged(check: str, passed: bool, detail: str) -> Verdict:
    return Verdict(check, "PASS" if passed else "FAIL", detail)


def skipped(check: str, reason: str) -> Verdict:
    return Verdict(check, "SKIP", reason)


def table(verdicts: list[Verdict]) -> str:
    rows = ["| check | verdict | detail |", "|---|---|---|"]
    rows += [f"| {v.check} | {v.status} | {cell(v.detail)} |" for v in verdicts]
    return "\n".join(rows)


def cell(text: str) -> str:
    """`text` as one Markdown table cell: on one line, no column separator."""
    return " ".join(text.split()).replace("|", "/")


def exit_code(verdicts: list[Verdict]) -> int:
    """1 when any check failed; a skipped check fails nothing."""
    return 1 if any(v.status == "FAIL" for v in verdicts) else 0
