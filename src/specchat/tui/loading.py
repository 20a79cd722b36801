"""The screen shown while the models load: it runs the loader in a thread and shows every step
the loader reports, never a silent wait; it is dismissed with the loaded backend. Quitting while
it loads does not wait for the load: the loader stops at its next report (LoadCancelled)."""

from textual import work
from textual.app import ComposeResult
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Log, ProgressBar, Static
from textual.worker import Worker, WorkerState

from specchat.tui.backend import ChatBackend, Loader
from specchat.tui.messages import BackendLoaded, LoadProgress, describe


class LoadCancelled(BaseException):
    """Raised in the loading thread, at the loader's next report, once the app is leaving. Python
    waits for that thread at exit, so an unstopped load held a quit for the rest of the load. A
    BaseException, as asyncio's CancelledError is: a loader's `except Exception` fallback must not
    load on; its cleanups (partial conversions removed, models closed) still run.
    """


class LoadingScreen(Screen[ChatBackend]):
    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen > Vertical { width: 80; height: auto; border: round $primary; padding: 1 2; }
    LoadingScreen #title { text-style: bold; }
    LoadingScreen Log { height: 10; margin-top: 1; }
    LoadingScreen #error { color: $text-error; display: none; }
    LoadingScreen.-failed #error { display: block; }
    """

    last_step = ""

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self.loader = loader
        # not `loading`: that is Textual's reactive which, set truthy, hides a widget behind a spinner
        self.load_worker: Worker | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("specchat: loading models", id="title")
            with Center():
                yield ProgressBar(total=None, show_eta=False)
            yield Log(auto_scroll=True)
            yield Static("", id="error")

    def on_mount(self) -> None:
        self.load_worker = self.load()

    @work(thread=True, exit_on_error=False)
    def load(self) -> None:
        backend = self.loader(self.report_progress)
        # Refused once the app is exiting: then nothing else would close what was loaded.
        if not self.post_message(BackendLoaded(backend)):
            backend.close()

    def report_progress(self, step: str, fraction: float | None = None) -> None:
        # Textual cancels every worker as the app exits; a thread worker can only stop itself.
        if self.load_worker is not None and self.load_worker.is_cancelled:
            raise LoadCancelled
        self.post_message(LoadProgress(step, fraction))

    def on_load_progress(self, message: LoadProgress) -> None:
        # A moving bar repeats its step text: log each step once, then only move the bar.
        if message.step != self.last_step:
            self.query_one(Log).write_line(message.step)
            self.last_step = message.step
        bar = self.query_one(ProgressBar)
        if message.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=message.fraction)

    def on_backend_loaded(self, message: BackendLoaded) -> None:
        self.dismiss(message.backend)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # The loader does not catch: its exception arrives here (and in the Textual log).
        if event.state == WorkerState.ERROR:
            self.query_one("#error", Static).update(f"Loading failed: {describe(event.worker.error)}\n"
                                                    "Press Ctrl+Q to quit.")
            self.add_class("-failed")
