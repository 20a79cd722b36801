"""The GPU check's last line: what passed, and what did not run and why, so that a run with
checks skipped never reads as if everything had been checked."""

from gpu_checks.verdict import Verdict


def closing_line(verdicts: list[Verdict]) -> str:
    failed = [v.check for v in verdicts if v.status == "FAIL"]
    if failed:
        return f"FAILED: {len(failed)} of {len(verdicts)} checks ({'; '.join(failed)})"
    skipped = [f"{v.check}: {v.detail}" for v in verdicts if v.status == "SKIP"]
    if skipped:
        return f"passed, {len(skipped)} skipped ({'; '.join(skipped)})"
    return "all checks passed"
