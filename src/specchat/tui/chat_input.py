"""The prompt: a TextArea where Enter sends and Shift+Enter or Ctrl+J start a new line."""

from collections.abc import Callable
from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from specchat.tui.history import InputHistory

Completer = Callable[[str], tuple[str, list[str]]]  # line -> (completed line, candidates)


class ChatInput(TextArea):
    DEFAULT_CSS = """
    ChatInput { height: auto; min-height: 3; max-height: 12; border: round $primary 60%; }
    ChatInput:focus { border: round $primary; }
    """
    BINDINGS = [Binding("tab", "complete", "Complete", show=False)]

    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class Completed(Message):
        candidates: list[str]

    def __init__(self, history: list[str], completer: Completer, **kwargs) -> None:
        super().__init__(soft_wrap=True, tab_behavior="focus", placeholder="Message, or /help", **kwargs)
        self.recall = InputHistory(history)
        self.completer = completer

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
        elif event.key in ("shift+enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
        else:
            await super()._on_key(event)

    def submit(self) -> None:
        text = self.text.strip()
        if not text:
            return
        self.recall.add(text)
        self.clear()
        self.post_message(self.Submitted(text))

    def show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def action_cursor_up(self, select: bool = False) -> None:
        # Up on the first line recalls; elsewhere it moves the cursor as usual.
        recalled = None if select or self.cursor_location[0] > 0 else self.recall.previous(self.text)
        if recalled is None:
            super().action_cursor_up(select)
        else:
            self.show(recalled)

    def action_cursor_down(self, select: bool = False) -> None:
        on_last_line = self.cursor_location[0] == self.document.line_count - 1
        recalled = self.recall.next() if on_last_line and not select else None
        if recalled is None:
            super().action_cursor_down(select)
        else:
            self.show(recalled)

    def action_complete(self) -> None:
        if not self.text.startswith("/"):
            self.screen.focus_next()
            return
        line, candidates = self.completer(self.text)
        self.show(line)
        self.post_message(self.Completed(candidates))
