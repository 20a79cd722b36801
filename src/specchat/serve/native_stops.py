"""llama.cpp's two stops for editors, over an infill reply's text as it comes. Both cut what the
target decoded, never change it: the text kept is a prefix of the exact reply.

- `n_indent`: a completion at the cursor belongs to the cursor's block. Every line after the
  first is judged once it shows a character that is not a space or a tab: indented less than
  `n_indent`, the reply ends before that character (an empty line counts as indent 0, so it ends
  the reply too, as in llama.cpp).
- `t_max_predict_ms`: past this long after the first text, the reply ends at the next new line
  (kept), so a slow suggestion still ends on a whole line.
"""

from collections.abc import Callable
from time import perf_counter

BLANKS = " \t"


class LineCut:
    def __init__(self, n_indent: int, t_max_s: float, clock: Callable[[], float] = perf_counter) -> None:
        self.n_indent, self.t_max_s, self.clock = n_indent, t_max_s, clock
        self.text = ""  # what has been kept
        self.line: int | None = None  # where the first line not yet judged starts (None: before any new line)
        self.started: float | None = None
        self.hit = False
        self.through = 0  # after a cut: where the character that decided it ends

    def push(self, piece: str) -> str:
        """The part of `piece` that is kept; after a cut, nothing more."""
        if self.hit or not piece:
            return ""
        now = self.clock()
        self.started = now if self.started is None else self.started
        start = len(self.text)
        self.text += piece
        shown = self.indent_cut(start) if self.n_indent > 0 else None  # cut before it
        newline = self.text.find("\n", start) if self.t_max_s > 0 and now - self.started > self.t_max_s else -1
        if shown is not None:
            self.hit, self.through, self.text = True, shown + 1, self.text[:shown]
        elif newline >= 0:  # kept
            self.hit, self.through, self.text = True, newline + 1, self.text[:newline + 1]
        return self.text[start:]

    def indent_cut(self, start: int) -> int | None:
        """Where the first line indented less than `n_indent` shows itself; None while none has
        (`start`: where the text new since the last call begins)."""
        while True:
            if self.line is None:
                newline = self.text.find("\n", start)  # none before `start`, or `line` would be set
                if newline < 0:
                    return None
                self.line = newline + 1
            shown = self.line
            while shown < len(self.text) and self.text[shown] in BLANKS:
                shown += 1
            if shown == len(self.text):
                return None  # only blanks yet: the line's indent is not known
            if shown - self.line < self.n_indent:
                return shown
            newline = self.text.find("\n", shown)
            if newline < 0:
                return None
            self.line = newline + 1
