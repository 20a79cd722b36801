"""The screen shown while the models load: every step the loader reports, never a silent wait."""

from textual.app import ComposeResult
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Log, ProgressBar, Static


class LoadingScreen(Screen):
    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen > Vertical { width: 80; height: auto; border: round $primary; padding: 1 2; }
    LoadingScreen #title { text-style: bold; }
    LoadingScreen Log { height: 10; margin-top: 1; }
    LoadingScreen #error { color: $text-error; display: none; }
    LoadingScreen.-failed #error { display: block; }
    """

    last_step = ""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("specchat: loading models", id="title")
            with Center():
                yield ProgressBar(total=None, show_eta=False)
            yield Log(auto_scroll=True)
            yield Static("", id="error")

    def report(self, step: str, fraction: float | None) -> None:
        # A moving bar repeats its step text: log each step once, then only move the bar.
        if step != self.last_step:
            self.query_one(Log).write_line(step)
            self.last_step = step
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=fraction)

    def fail(self, error: str) -> None:
        self.query_one("#error", Static).update(f"Loading failed: {error}\nPress Ctrl+Q to quit.")
        self.add_class("-failed")
