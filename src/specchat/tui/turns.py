"""The widgets a conversation is made of: system prompt, user and assistant turns, notices."""

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from specchat.tui.redraw import Redraw


class SystemTurn(Static):
    DEFAULT_CSS = """
    SystemTurn { color: $text-muted; text-style: italic; padding: 0 1; margin-bottom: 1; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(f"system: {text}", markup=False)


class UserTurn(Static):
    DEFAULT_CSS = """
    UserTurn { background: $boost; border-left: thick $accent; padding: 0 1; margin: 1 0 0 0; }
    """

    def __init__(self, text: str) -> None:
        # Shown verbatim: what the user typed is not markup.
        super().__init__(text, markup=False)
        self.text = text


class Notice(Static):
    """An inline message from the app: command results, errors, context notices."""

    DEFAULT_CSS = """
    Notice { color: $text-muted; padding: 0 1; }
    Notice.error { color: $text-error; }
    """

    def __init__(self, text: str, error: bool = False) -> None:
        super().__init__(text, markup=False, classes="error" if error else "")
        self.text = text


class AssistantTurn(Vertical):
    """A reply, streamed as markdown while it is decoded (at most one redraw every REDRAW_S); a cut
    reply is marked as such."""

    DEFAULT_CSS = """
    AssistantTurn { height: auto; margin: 1 0 0 0; }
    AssistantTurn Markdown { margin: 0; padding: 0 1; }
    AssistantTurn .cut { color: $text-warning; padding: 0 1; display: none; }
    AssistantTurn.-cut .cut { display: block; }
    """

    def __init__(self, text: str = "", cut: bool = False) -> None:
        super().__init__(classes="-cut" if cut else "")
        self.text = text
        self.stream: MarkdownStream | None = None
        self.pending = ""  # text written since the last redraw
        self.redraw = Redraw(self, self.draw_pending)

    @property
    def cut(self) -> bool:
        return self.has_class("-cut")

    def compose(self) -> ComposeResult:
        yield Markdown(self.text)
        yield Static("⏹ reply cut", classes="cut")

    async def write(self, fragment: str) -> None:
        self.text += fragment
        self.pending += fragment
        await self.redraw.request()

    async def draw_pending(self) -> None:
        """Hand the text written since the last redraw to the markdown's stream."""
        if not self.pending:
            return
        if self.stream is None:
            self.stream = Markdown.get_stream(self.query_one(Markdown))
        fragment, self.pending = self.pending, ""
        await self.stream.write(fragment)

    async def close(self, cut: bool) -> None:
        await self.redraw.now()
        if self.stream is not None:
            await self.stream.stop()
            self.stream = None
        self.set_class(cut, "-cut")
