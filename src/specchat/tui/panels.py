"""The live decoding panels: acceptance and tree sparklines, timings, throughput, settings."""

from statistics import fmean

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Sparkline, Static

from specchat.decoding.events import IterationEvent
from specchat.tui.livestats import WINDOW, LiveStats
from specchat.tui.settings import DecodingSettings


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def acceptance_text(stats: LiveStats) -> str:
    last = stats.last.accepted if stats.last else 0
    return f"last {last} · mean {stats.mean_accepted:.2f} over {len(stats.accepted)}"


def tree_text(stats: LiveStats) -> str:
    last = stats.last
    return f"size {last.tree_size} · depth {last.depth}" if last else "size – · depth –"


def transfer_text(stats: LiveStats, label: str) -> str:
    if not label:
        return "transfer: none (weights resident)"
    seconds = stats.last.transfer_s if stats.last else 0.0
    stall = stats.last.stall_s if stats.last else 0.0
    # Two short lines: the panel is ~34 columns wide.
    return f"transfer {label}: {ms(seconds)}\n{stats.transfer_gb_per_s:.2f} GB/s · stall {ms(stall)}"


def timing_text(stats: LiveStats) -> str:
    last = stats.last
    draft, target = (last.draft_s, last.target_s) if last else (0.0, 0.0)
    return f"draft {ms(draft)} · target {ms(target)}\n{stats.tokens_per_s:.1f} tokens/s"


class Panels(VerticalScroll):
    """Shows what each decoding iteration did; updated once per engine event."""

    DEFAULT_CSS = """
    Panels {
        width: 38;
        border-left: vkey $primary 50%;
        padding: 0 1;
    }
    Panels .title { text-style: bold; color: $text-primary; margin-top: 1; }
    Panels Sparkline { height: 3; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stats = LiveStats()
        self.transfer_label = ""  # the backend's, once it is loaded

    def compose(self) -> ComposeResult:
        yield Static(f"Accepted per iteration (last {WINDOW})", classes="title")
        yield Sparkline([], summary_function=fmean, id="accepted-spark")
        yield Static(acceptance_text(self.stats), id="accepted")
        yield Static("Draft tree", classes="title")
        yield Sparkline([], summary_function=fmean, id="tree-spark")
        yield Static(tree_text(self.stats), id="tree")
        yield Static("Cost per iteration", classes="title")
        yield Static(timing_text(self.stats), id="timing")
        yield Static(transfer_text(self.stats, self.transfer_label), id="transfer")
        yield Static("Settings", classes="title")
        yield Static("", id="settings")

    def start_reply(self) -> None:
        self.stats.start_reply()

    def record(self, event: IterationEvent) -> None:
        self.stats.record(event)
        self.show_figures()

    def show_figures(self) -> None:
        self.query_one("#accepted-spark", Sparkline).data = list(self.stats.accepted)
        self.query_one("#tree-spark", Sparkline).data = list(self.stats.tree_sizes)
        self.query_one("#accepted", Static).update(acceptance_text(self.stats))
        self.query_one("#tree", Static).update(tree_text(self.stats))
        self.query_one("#timing", Static).update(timing_text(self.stats))
        self.query_one("#transfer", Static).update(transfer_text(self.stats, self.transfer_label))

    def show_settings(self, settings: DecodingSettings) -> None:
        seed = "off" if settings.seed is None else settings.seed
        self.query_one("#settings", Static).update(
            f"engine {settings.engine}\nbudget {settings.budget} · depth {settings.depth}\n"
            f"temp {settings.temperature:g} · top-p {settings.top_p:g} · seed {seed}"
        )
