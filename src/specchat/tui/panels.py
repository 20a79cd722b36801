"""The live decoding panels: acceptance and tree sparklines, timings, throughput, settings, and
for dsi its verification jobs."""

from statistics import fmean

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Sparkline, Static

from specchat.decoding.events import ALONE, LOOK, IterationEvent
from specchat.tui.livestats import WINDOW, LiveStats
from specchat.tui.redraw import Redraw
from specchat.tui.settings import DecodingSettings

DSI = "dsi"  # the engine whose panels show verification jobs and lookahead rather than a tree shape
MIN_WIDTH = 110  # terminal columns below which the panels start hidden


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def acceptance_text(stats: LiveStats) -> str:
    last = stats.last.accepted if stats.last else 0
    return f"last {last} · mean {stats.mean_accepted:.2f} over {len(stats.accepted)}"


def tree_text(stats: LiveStats) -> str:
    last = stats.last
    if last is None:
        return "size – · depth –"
    if last.drafting == ALONE:  # --budget auto predicted the target alone faster
        return f"drafting off: target alone\n{last.rate_alone:.1f} tok/s vs {last.rate_with_tree:.1f} with a tree"
    look = " · a look" if last.drafting == LOOK else ""
    return f"size {last.tree_size} · depth {last.depth}{look}"


def jobs_text(stats: LiveStats) -> str:
    last = stats.last
    now = (f"sent {last.jobs_submitted} · preempted {last.jobs_preempted} · in flight {last.jobs_in_flight}"
           if last else "sent – · preempted – · in flight –")
    return f"{now}\nreply: sent {stats.reply_jobs_submitted} · preempted {stats.reply_jobs_preempted}"


def transfer_text(stats: LiveStats, label: str) -> str:
    if not label:
        return "transfer: none (weights resident)"
    seconds = stats.last.transfer_s if stats.last else 0.0
    stall = stats.last.stall_s if stats.last else 0.0
    idle = stats.last.link_idle if stats.last else 0.0
    # Short lines: the panel is ~34 columns wide.
    return f"transfer {label}: {ms(seconds)}\n{stats.transfer_gb_per_s:.2f} GB/s · stall {ms(stall)}\nlink idle {idle:.0%}"


def timing_text(stats: LiveStats) -> str:
    last = stats.last
    draft, target = (last.draft_s, last.target_s) if last else (0.0, 0.0)
    return f"draft {ms(draft)} · target {ms(target)}\n{stats.tokens_per_s:.1f} tokens/s"


def settings_text(settings: DecodingSettings, workers: int) -> str:
    seed = "off" if settings.seed is None else settings.seed
    shape = (f"lookahead {settings.lookahead} · workers {workers}" if settings.engine == DSI
             else f"budget {settings.budget} · depth {settings.depth}")
    sampling = f"temp {settings.temperature:g} · top-p {settings.top_p:g} · seed {seed}"
    lines = [f"engine {settings.engine}", shape, sampling]
    extras = extra_labels(settings)
    if extras:  # a line only where one is on, so a chat with the defaults shows what it always showed
        lines.append(" · ".join(extras))
    return "\n".join(lines)


def extra_labels(settings: DecodingSettings) -> list[str]:
    """The settings that are off by default and on here: the top-k, min-p, typical-p, top-n-sigma and
    XTC cuts and the dynamic temperature (or mirostat, in their place), the penalties (each with the
    window it counts)."""
    labels = []
    if settings.top_k > 0:
        labels.append(f"top-k {settings.top_k}")
    if settings.min_p > 0:
        labels.append(f"min-p {settings.min_p:g}")
    if settings.typical_p < 1:
        labels.append(f"typical-p {settings.typical_p:g}")
    if settings.top_n_sigma > 0:
        labels.append(f"top-n-sigma {settings.top_n_sigma:g}")
    if settings.xtc_probability > 0:
        labels.append(f"xtc {settings.xtc_probability:g} (threshold {settings.xtc_threshold:g})")
    if settings.dynatemp_range > 0:
        labels.append(f"dynatemp ±{settings.dynatemp_range:g} (exponent {settings.dynatemp_exponent:g})")
    if settings.mirostat:
        labels.append(f"mirostat {settings.mirostat} (tau {settings.mirostat_tau:g}, eta {settings.mirostat_eta:g})")
    window = "all" if settings.repeat_last_n < 0 else settings.repeat_last_n
    for name, value, off in (("repeat", settings.repeat_penalty, 1.0), ("presence", settings.presence_penalty, 0.0),
                             ("frequency", settings.frequency_penalty, 0.0)):
        if value != off:
            labels.append(f"{name} {value:g}/{window}")
    if settings.dry_multiplier:
        back = "all" if settings.dry_penalty_last_n < 0 else settings.dry_penalty_last_n
        labels.append(f"dry {settings.dry_multiplier:g} (base {settings.dry_base:g}, allowed "
                      f"{settings.dry_allowed_length})/{back}")
    return labels


class Panels(VerticalScroll):
    """Shows what the decoding iterations did: each engine event recorded, the figures redrawn at
    most once every REDRAW_S and as a reply ends."""

    DEFAULT_CSS = """
    Panels {
        width: 38;
        border-left: vkey $primary 50%;
        padding: 0 1;
    }
    Panels .title { text-style: bold; color: $text-primary; margin-top: 1; }
    Panels Sparkline { height: 3; }
    Panels #jobs-section { height: auto; display: none; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stats = LiveStats()
        self.transfer_label = ""  # the backend's, once it is loaded
        self.toggled = False  # shown or hidden by hand (F2): the terminal's width no longer decides
        self.redraw = Redraw(self, self.draw_figures)

    def compose(self) -> ComposeResult:
        yield Static(f"Accepted per iteration (last {WINDOW})", classes="title")
        yield Sparkline([], summary_function=fmean, id="accepted-spark")
        yield Static(acceptance_text(self.stats), id="accepted")
        yield Static("Draft tree", classes="title")
        yield Sparkline([], summary_function=fmean, id="tree-spark")
        yield Static(tree_text(self.stats), id="tree")
        with Vertical(id="jobs-section"):  # shown for dsi only, see show_settings
            yield Static("Verification jobs", classes="title")
            yield Static(jobs_text(self.stats), id="jobs")
        yield Static("Cost per iteration", classes="title")
        yield Static(timing_text(self.stats), id="timing")
        yield Static(transfer_text(self.stats, self.transfer_label), id="transfer")
        yield Static("Settings", classes="title")
        yield Static("", id="settings")

    def fit(self, width: int) -> None:
        """Show the panels on a terminal `width` columns wide, unless toggled by hand."""
        if not self.toggled:
            self.display = width >= MIN_WIDTH

    def toggle(self) -> None:
        self.toggled = True
        self.display = not self.display

    def start_reply(self) -> None:
        self.stats.start_reply()

    async def record(self, event: IterationEvent) -> None:
        self.stats.record(event)
        await self.redraw.request()

    async def draw_figures(self) -> None:
        self.show_figures()

    def show_figures(self) -> None:
        self.query_one("#accepted-spark", Sparkline).data = list(self.stats.accepted)
        self.query_one("#tree-spark", Sparkline).data = list(self.stats.tree_sizes)
        self.query_one("#accepted", Static).update(acceptance_text(self.stats))
        self.query_one("#tree", Static).update(tree_text(self.stats))
        self.query_one("#jobs", Static).update(jobs_text(self.stats))
        self.query_one("#timing", Static).update(timing_text(self.stats))
        self.query_one("#transfer", Static).update(transfer_text(self.stats, self.transfer_label))

    def show_settings(self, settings: DecodingSettings, workers: int) -> None:
        """Show `settings`, and the sections that apply to their engine; `workers` is dsi's count."""
        self.query_one("#settings", Static).update(settings_text(settings, workers))
        self.query_one("#jobs-section", Vertical).display = settings.engine == DSI
