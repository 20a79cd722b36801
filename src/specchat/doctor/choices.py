"""The choices this machine keeps (quant/widths.py: which product serves which width; and
models/draft_step.py: what a draft's step costs in each form the plan weighs; measured once and
kept), as `specchat doctor` lists them, and measured again on `--measure-again`."""

import json

from specchat.machine_choices import BUSY, Kept, kept_choices
from specchat.models import draft_step
from specchat.quant import widths


def choice_lines(again: bool) -> list[str]:
    """The kept choices, each with the load it was measured under; with `again`, each measured
    again first, whatever the load now."""
    kept = kept_choices()
    if again:
        kept = [measure_again(choice) for choice in kept]
    heading = f"kept choices ({'measured again now' if again else 'measured once per machine'}; load: the share " \
              "of the measurement's time spent waiting for a core)"
    if not kept:
        return [heading, "  none yet: the first run that needs one measures it"]
    return [heading, *(choice_line(choice) for choice in kept)]


def measure_again(choice: Kept) -> Kept:
    """`choice` measured again by the module that keeps it."""
    keeper = draft_step if choice.choice == draft_step.CHOICE else widths
    return keeper.measure_again(choice)


def choice_line(choice: Kept) -> str:
    key = " ".join(f"{name}={str(value).removeprefix('torch.')}" for name, value in choice.key.items())
    busy = f"; busy (>= {BUSY:g}): measured again at a quiet startup" if choice.busy else ""
    return f"  {choice.choice:<24} {key:<54} {json.dumps(choice.value):<20} load {choice.load:.2f}{busy}"
