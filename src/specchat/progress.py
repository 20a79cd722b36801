"""How far model preparation has got: as tqdm bars on stderr (the CLI), through a callback (the TUI's
loading screen), both or neither.

Kept free of torch and transformers imports: `specchat models` imports this through the embedded
model code and must stay fast.
"""

import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

Report = Callable[[str, float | None], None]  # a step's description and, if known, the fraction done

# Each report is a line on the loading screen, so a bar reports at most every 5% of its total
# (plus its start, its end and every change of text) rather than on every tqdm refresh.
_MIN_ADVANCE = 0.05


@dataclass(frozen=True)
class Reporter:
    bars: bool  # draw tqdm bars on stderr
    report: Report | None = None

    def bar(self, *args: Any, **options: Any) -> tqdm:
        """A tqdm bar (same arguments as tqdm) whose `desc` and fraction also go to `report`."""
        return ReportingBar(*args, reporter=self, **options)

    def step(self, text: str, fraction: float | None = None) -> None:
        """A step without a bar: to the callback only, as the CLI shows bars and nothing in between."""
        if self.report is not None:
            self.report(text, fraction)

    def notice(self, text: str) -> None:
        """A one-off message: a stderr line where bars are drawn, and a step for the callback."""
        if self.bars:
            print(text, file=sys.stderr)
        self.step(text)


class _Discard(io.TextIOBase):
    """Where a bar draws when only the callback wants its progress."""

    def write(self, text: str) -> int:
        return len(text)


class ReportingBar(tqdm):
    """A tqdm bar that also sends "desc[: postfix]" and n/total to its reporter's callback.

    tqdm draws through `display` on every refresh (rate-limited by its mininterval) and on close;
    tqdm's documentation names it as the method to override for another frontend.
    """

    def __init__(self, *args: Any, reporter: Reporter, **options: Any) -> None:
        self.reporter = reporter
        self.label = options.get("desc") or ""
        self.last_sent: tuple[str, float | None] | None = None
        sink = {} if reporter.bars else {"file": _Discard()}
        super().__init__(*args, **options, **sink, disable=not reporter.bars and reporter.report is None)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool | None:
        self.send()
        return super().display(msg, pos)

    def text(self) -> str:
        return f"{self.label}: {self.postfix}" if self.postfix else self.label

    def fraction(self) -> float | None:
        return min(self.n / self.total, 1.0) if self.total else None

    def send(self) -> None:
        state = (self.text(), self.fraction())
        if self.reporter.report is not None and worth_sending(self.last_sent, state):
            self.last_sent = state
            self.reporter.report(*state)


def worth_sending(last: tuple[str, float | None] | None, state: tuple[str, float | None]) -> bool:
    if last is None or last[0] != state[0]:
        return True
    last_fraction, fraction = last[1], state[1]
    if fraction is None or last_fraction is None:
        return fraction != last_fraction
    return fraction - last_fraction >= _MIN_ADVANCE or (fraction == 1.0 and last_fraction < 1.0)


@contextmanager
def transformers_bars(reporter: Reporter, label: Callable[[str], str]) -> Iterator[None]:
    """Route the bars transformers draws while loading or saving a model (e.g. "Loading weights",
    and GGUF dequantization) through `reporter`, with the text `label(desc)`.

    With `reporter.bars` off they draw nothing on stderr, where they would land in the middle of the
    TUI. The hook is process-wide: loads must not overlap in threads (the app runs one loader).
    """
    # Imported here: transformers takes seconds to import, and this module must stay light.
    from transformers import modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as transformers_logging

    # A user who switched Hugging Face's bars off (HF_HUB_DISABLE_PROGRESS_BARS) gets none drawn here either.
    routed = Reporter(reporter.bars and transformers_logging.is_progress_bar_enabled(), reporter.report)

    def routed_bar(*args: Any, **options: Any) -> tqdm:
        return routed.bar(*args, **{**options, "desc": label(options.get("desc", ""))})

    def hook(factory: Callable[..., Any], args: tuple[Any, ...], options: dict[str, Any]) -> tqdm:
        return routed_bar(*args, **options)  # in place of `factory`, which ignores our reporter

    def dequantizing_bar(*args: Any, **options: Any) -> tqdm:
        return routed_bar(*args, **{**options, "desc": "dequantizing tensors"})

    previous_hook = transformers_logging.set_tqdm_hook(hook)
    # The GGUF reader draws with its own module-level tqdm, which the hook does not reach.
    gguf_tqdm = gguf_loading.tqdm
    gguf_loading.tqdm = dequantizing_bar
    try:
        yield
    finally:
        gguf_loading.tqdm = gguf_tqdm
        transformers_logging.set_tqdm_hook(previous_hook)
