"""At most one redraw of a widget every REDRAW_S while a reply streams.

Each redraw is Python work on the UI thread beside the decoding: Textual lays out and renders
what changed (a reply's markdown: its last block parsed and rendered again, a code block
highlighted whole, ~20-30 ms on the AMD EPYC; the panels: sparklines and figures). On two cores
torch's two threads fill the CPU and the decoding thread needs the GIL to dispatch each operator,
so redrawn per token the chat decoded at 0.64x `generate`'s speed (docs/benchmarks.md).
"""

import math
from collections.abc import Awaitable, Callable
from time import monotonic

from textual.timer import Timer
from textual.widget import Widget

REDRAW_S = 0.5  # what changes sooner waits for the next redraw, at most this long


class Redraw:
    """Runs `draw` at most once every REDRAW_S: at once when the last run is that old, else once
    when it will be (on `widget`'s timer); `now` runs it at once, as a reply ends."""

    def __init__(self, widget: Widget, draw: Callable[[], Awaitable[None]]) -> None:
        self.widget = widget
        self.draw = draw
        self.drawn_at = -math.inf  # monotonic seconds of the last run
        self.timer: Timer | None = None

    async def request(self) -> None:
        if self.timer is not None:
            return
        wait = self.drawn_at + REDRAW_S - monotonic()
        if wait > 0:
            self.timer = self.widget.set_timer(wait, self.now)
        else:
            await self.now()

    async def now(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
        self.drawn_at = monotonic()
        await self.draw()
