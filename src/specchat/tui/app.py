"""The chat app: a conversation view, live panels and a prompt, over any ChatBackend.

Decoding runs in a thread worker that posts one message per engine iteration, so keys are
handled while the engine works; cancelling closes the reply in the UI at once and the worker
stops after the iteration in progress.
"""

import threading
from dataclasses import replace
from functools import partial
from itertools import count
from pathlib import Path
from time import perf_counter

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.events import Resize
from textual.widgets import Footer, Header, Static
from textual.worker import Worker, WorkerState

from specchat.decoding.events import Engine, IterationEvent, LiveSettings
from specchat.errors import SpecchatError
from specchat.summary import Summary, summarize
from specchat.tui import commands
from specchat.tui.backend import ChatBackend, Loader
from specchat.tui.chat_input import ChatInput
from specchat.tui.clipboard import last_code_block
from specchat.tui.context import ContextOverflow, fit_prompt
from specchat.tui.decoder import ReplyJob, decode_reply
from specchat.tui.export import to_markdown
from specchat.tui.livestats import stats_report
from specchat.tui.loading import LoadingScreen
from specchat.tui.messages import BackendLoaded, EngineNotice, IterationArrived, LoadProgress, ReplyFinished
from specchat.tui.panels import Panels
from specchat.tui.settings import DecodingSettings
from specchat.tui.store import ConversationStore
from specchat.tui.transcript import Entry, system_messages, title_of
from specchat.tui.turns import AssistantTurn, Notice, SystemTurn, UserTurn

PANELS_MIN_WIDTH = 110  # columns below which the panels start hidden
# Settings an engine reads while it decodes, and when a change made mid-reply takes effect.
LIVE_FROM = {"budget": "the next iteration", "depth": "the next iteration", "lookahead": "the next job"}
NOTICE_TOAST_S = 12  # an engine notice is a long line: time to read it
KEYS_HELP = (
    "keys: Enter send · Shift+Enter/Ctrl+J newline · Up/Down recall · Tab complete · Esc stop reply · "
    "Ctrl+C stop, twice quit · Ctrl+R copy reply · Ctrl+O copy code · F2 panels"
)


def describe(error: BaseException) -> str:
    """One line for the user: a SpecchatError is already worded for them, others get their type."""
    return str(error) if isinstance(error, SpecchatError) else f"{type(error).__name__}: {error}"


class SpecchatApp(App):
    TITLE = "specchat"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #body { height: 1fr; }
    #conversation { height: 1fr; padding: 0 1; }
    #hint { color: $text-muted; padding: 0 2; display: none; }
    #hint.-shown { display: block; }
    """
    BINDINGS = [
        Binding("escape", "stop_reply", "Stop"),
        Binding("ctrl+c", "interrupt", "Stop/quit", priority=True),
        Binding("ctrl+r", "copy_reply", "Copy reply"),
        Binding("ctrl+o", "copy_code", "Copy code"),
        Binding("f2", "toggle_panels", "Panels"),
    ]

    def __init__(
        self,
        backend: ChatBackend | None,
        store: ConversationStore,
        conversation_id: int | None = None,
        loader: Loader | None = None,
    ) -> None:
        """Give either a ready `backend`, or a `loader` run behind a loading screen."""
        super().__init__()
        if (backend is None) == (loader is None):
            raise ValueError("SpecchatApp needs exactly one of backend and loader")
        self.backend = backend
        self.loader = loader
        self.store = store
        self.resume_id = conversation_id
        self.conversation_id: int | None = None  # created with the first message
        self.settings = DecodingSettings()
        self.entries: list[Entry] = []
        self.job: ReplyJob | None = None
        self.job_worker: Worker | None = None
        self.reply_turn: AssistantTurn | None = None
        self.reply_events: list[IterationEvent] = []
        self.reply_started = 0.0
        self.last_summary: Summary | None = None
        self.reply_ids = count(1)
        self.engine_lock = threading.Lock()  # one generate() at a time, see decode_reply
        self.dropped = 0  # oldest messages currently left out of the context
        self.quit_armed = False
        self.panels_toggled = False
        # Held rather than queried: queries look at the active screen, which may be the loader.
        self.view = VerticalScroll(id="conversation")
        self.panels = Panels(id="panels")
        self.hint = Static("", id="hint")
        self.prompt = ChatInput(store.recent_inputs(), self.complete_line, id="prompt")

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield self.view
            yield self.panels
        yield self.hint
        yield self.prompt
        yield Footer()

    async def on_mount(self) -> None:
        # Anchored, the view follows new text only while it is scrolled to the bottom.
        self.view.anchor()
        self.show_panels_by_width(self.size.width)
        if self.backend is None:
            await self.push_screen(LoadingScreen())
            self.load_backend()
        else:
            await self.start(self.backend)

    def on_unmount(self) -> None:
        # Quitting mid-reply keeps what was written, as a cut reply.
        if self.job:
            self.job.cancel.set()
            self.save_reply(self.reply_turn.text, cut=True)

    def on_resize(self, event: Resize) -> None:
        if not self.panels_toggled:
            self.show_panels_by_width(event.size.width)

    def show_panels_by_width(self, width: int) -> None:
        self.panels.display = width >= PANELS_MIN_WIDTH

    # Loading

    @work(thread=True, exit_on_error=False, group="load")
    def load_backend(self) -> None:
        backend = self.loader(self.report_progress)
        self.post_message(BackendLoaded(backend))

    def report_progress(self, step: str, fraction: float | None = None) -> None:
        self.post_message(LoadProgress(step, fraction))

    def on_load_progress(self, message: LoadProgress) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.screen.report(message.step, message.fraction)

    async def on_backend_loaded(self, message: BackendLoaded) -> None:
        await self.pop_screen()
        await self.start(message.backend)

    async def start(self, backend: ChatBackend) -> None:
        self.backend = backend
        self.settings = backend.settings
        self.sub_title = backend.name
        self.panels.transfer_label = backend.transfer_label
        self.panels.show_figures()
        self.show_settings()
        if self.resume_id is not None:
            await self.open_conversation(self.resume_id)
        elif self.settings.system_prompt:
            await self.view.mount(SystemTurn(self.settings.system_prompt))
        self.prompt.focus()

    async def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Workers do not catch: their exceptions arrive here (and in the Textual log).
        if event.state != WorkerState.ERROR:
            return
        error = describe(event.worker.error)
        if event.worker.group == "load" and isinstance(self.screen, LoadingScreen):
            self.screen.fail(error)
        elif event.worker is self.job_worker and self.is_running:
            await self.end_reply(cut=True)
            await self.notice(f"decoding failed: {error}", error=True)

    # Sending and streaming

    @on(ChatInput.Submitted)
    async def submitted(self, message: ChatInput.Submitted) -> None:
        self.hide_hint()
        self.quit_armed = False
        if commands.is_command(message.text):
            await self.run_command(message.text)
        elif self.job:
            await self.notice("a reply is being written: Esc stops it, Up recalls your message", error=True)
        else:
            await self.send(message.text)

    async def send(self, text: str) -> None:
        if self.conversation_id is None:
            self.conversation_id = self.store.new_conversation(title_of(text), self.settings.system_prompt)
        message_id = self.store.add_message(self.conversation_id, "user", text)
        self.entries.append(Entry("user", text, False, message_id))
        await self.view.mount(UserTurn(text))
        await self.start_reply()

    async def start_reply(self) -> None:
        try:
            prompt = fit_prompt(
                system_messages(self.settings.system_prompt), [entry.as_message() for entry in self.entries],
                self.backend.encode, self.backend.context_tokens, self.settings.max_tokens,
            )
        except ContextOverflow as error:
            await self.notice(str(error), error=True)
            return
        if prompt.dropped > self.dropped:
            await self.notice(f"context full: the oldest {prompt.dropped} messages are left out (system prompt kept)")
        self.dropped = prompt.dropped
        self.reply_turn = AssistantTurn()
        await self.view.mount(self.reply_turn)
        self.job = ReplyJob(
            next(self.reply_ids), self.backend.engine, prompt.ids, prompt.max_new_tokens,
            self.settings.sampling(), self.backend.new_text_stream(),
        )
        self.reply_events = []
        self.reply_started = perf_counter()
        self.panels.start_reply()
        self.job_worker = self.run_worker(
            partial(decode_reply, self.job, self.engine_lock, self.post_message),
            thread=True, exit_on_error=False, group="decode",
        )

    def is_current(self, reply_id: int) -> bool:
        # Once exit begins the widgets are being torn down: late events are dropped.
        return self.is_running and self.job is not None and self.job.id == reply_id

    async def on_iteration_arrived(self, message: IterationArrived) -> None:
        if not self.is_current(message.reply_id):
            return
        self.reply_events.append(message.event)
        self.panels.record(message.event)
        await self.reply_turn.write(message.text)

    async def on_engine_notice(self, message: EngineNotice) -> None:
        # About the engine, not one reply: shown even when that reply was cut meanwhile. The toast
        # catches the eye mid-reply, the line above the reply keeps it in the transcript.
        if not self.is_running:
            return
        self.notify(message.text, title="engine notice", severity="warning", timeout=NOTICE_TOAST_S)
        await self.view.mount(Notice(message.text), before=self.reply_turn)

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        if self.is_current(message.reply_id):
            await self.reply_turn.write(message.text)
            await self.end_reply(cut=False)

    async def end_reply(self, cut: bool) -> None:
        """Close the reply in the UI and save it; the prompt is usable again at once."""
        job, turn = self.job, self.reply_turn
        self.job, self.reply_turn, self.job_worker = None, None, None
        job.cancel.set()
        await turn.close(cut)
        self.save_reply(turn.text, cut)

    def save_reply(self, text: str, cut: bool) -> None:
        message_id = self.store.add_message(self.conversation_id, "assistant", text, cut)
        self.entries.append(Entry("assistant", text, cut, message_id))
        self.last_summary = summarize(self.reply_events, perf_counter() - self.reply_started)

    async def notice(self, text: str, error: bool = False) -> None:
        await self.view.mount(Notice(text, error))

    # Keys

    async def action_stop_reply(self) -> None:
        if self.job:
            await self.end_reply(cut=True)

    async def action_interrupt(self) -> None:
        if self.quit_armed:
            self.exit()
            return
        self.quit_armed = True
        if self.job:
            await self.end_reply(cut=True)
            self.notify("Reply stopped. Ctrl+C again quits.")
        else:
            self.notify("Press Ctrl+C again to quit.")

    def on_text_area_changed(self) -> None:
        self.quit_armed = False

    def last_reply(self) -> str:
        turns = self.view.query(AssistantTurn)
        return turns.last().text if turns else ""

    def action_copy_reply(self) -> None:
        self.copy_text(self.last_reply(), "reply")

    def action_copy_code(self) -> None:
        self.copy_text(last_code_block(self.last_reply()) or "", "code block")

    def copy_text(self, text: str, what: str) -> None:
        if text:
            self.copy_to_clipboard(text)
            self.notify(f"{what} copied")
        else:
            self.notify(f"no {what} to copy", severity="warning")

    def action_toggle_panels(self) -> None:
        self.panels_toggled = True
        self.panels.display = not self.panels.display

    def complete_line(self, line: str) -> tuple[str, list[str]]:
        return commands.complete(line, self.backend.engine_names)

    @on(ChatInput.Completed)
    def show_completions(self, message: ChatInput.Completed) -> None:
        name = message.candidates[0][1:].split(" ")[0] if len(message.candidates) == 1 else ""
        spec = commands.COMMANDS.get(name)
        text = f"{spec.usage}  {spec.summary}" if spec else "  ".join(message.candidates)
        self.hint.update(text or "no completion")
        self.hint.add_class("-shown")

    def hide_hint(self) -> None:
        self.hint.remove_class("-shown")

    # Slash commands

    async def run_command(self, text: str) -> None:
        try:
            command = commands.parse(text)
        except commands.CommandError as error:
            await self.notice(str(error), error=True)
            return
        if self.job and isinstance(command, commands.Clear | commands.Retry | commands.Load):
            await self.notice("a reply is being written: press Esc to stop it first", error=True)
            return
        await self.execute(command)

    async def execute(self, command: commands.Command) -> None:
        match command:
            case commands.SetSetting(field="engine", value=name):
                await self.switch_engine(name)
            case commands.SetSetting(field="system_prompt", value=text):
                await self.set_system_prompt(text)
            case commands.SetSetting(field="lookahead", value=lookahead):
                await self.set_lookahead(lookahead)
            case commands.SetSetting(field=field, value=value):
                await self.change_setting(field, value)
            case commands.Clear():
                await self.clear()
            case commands.Retry():
                await self.retry()
            case commands.Save(path=path):
                await self.save(path)
            case commands.Load(conversation_id=None):
                await self.list_conversations()
            case commands.Load(conversation_id=conversation_id):
                await self.open_conversation(conversation_id)
            case commands.Stats():
                await self.notice(stats_report(self.last_summary, self.panels.stats))
            case commands.Help():
                await self.notice("\n".join(commands.help_lines() + [KEYS_HELP]))
            case commands.Quit():
                self.exit()

    async def change_setting(self, field: str, value: object) -> None:
        self.settings = self.settings.with_value(field, value)
        self.show_settings()
        if field in LIVE_FROM:
            self.apply_live_settings(self.backend.engine)
        when = f"from {LIVE_FROM.get(field, 'the next reply')}" if self.job else ""
        shown = "off" if value is None else value
        await self.notice(f"{field.replace('_', '-')} set to {shown} {when}".rstrip())

    async def set_lookahead(self, lookahead: int) -> None:
        # Refused rather than kept for later: dsi runs alone (/engine never offers it), so a
        # lookahead set on another engine would never apply.
        engine = self.backend.engine
        if engine.live_settings().lookahead is None:
            await self.notice(f"/lookahead applies to the dsi engine only, not {engine.name}", error=True)
            return
        await self.change_setting("lookahead", lookahead)

    def apply_live_settings(self, engine: Engine) -> None:
        # An engine takes only what it reads (autoregressive nothing): the other values wait in
        # the settings until an engine that reads them is chosen.
        engine.apply(LiveSettings(budget=self.settings.budget, depth=self.settings.depth,
                                  lookahead=self.settings.lookahead))

    def show_settings(self) -> None:
        self.panels.show_settings(self.settings, self.backend.engine.live_settings().workers or 0)

    async def switch_engine(self, name: str) -> None:
        if name not in self.backend.engine_names:
            choices = ", ".join(self.backend.engine_names)
            await self.notice(f"unknown engine '{name}': choose one of {choices}", error=True)
            return
        self.apply_live_settings(self.backend.use_engine(name))
        self.settings = replace(self.settings, engine=name)
        self.show_settings()
        await self.notice(f"engine set to {name}" + (" from the next reply" if self.job else ""))

    async def set_system_prompt(self, text: str) -> None:
        self.settings = replace(self.settings, system_prompt=text)
        if self.conversation_id is not None:
            self.store.set_system_prompt(self.conversation_id, text)
        shown = self.view.query(SystemTurn)
        if shown:
            shown.first().update(f"system: {text}")
        else:
            await self.view.mount(SystemTurn(text), before=0)
        await self.notice("system prompt set")

    async def clear(self) -> None:
        await self.reset_view()
        self.conversation_id = None
        await self.notice("new conversation")

    async def reset_view(self) -> None:
        await self.view.remove_children()
        self.entries = []
        self.dropped = 0
        if self.settings.system_prompt:
            await self.view.mount(SystemTurn(self.settings.system_prompt))

    async def retry(self) -> None:
        if not any(entry.role == "user" for entry in self.entries):
            await self.notice("nothing to retry yet", error=True)
            return
        if self.entries[-1].role == "assistant":
            self.store.delete_message(self.entries.pop().message_id)
            await self.view.query(AssistantTurn).last().remove()
        await self.start_reply()

    async def save(self, path: str | None) -> None:
        if self.conversation_id is None:
            await self.notice("nothing to save yet", error=True)
            return
        conversation = self.store.conversation(self.conversation_id)
        target = Path(path or f"specchat-{self.conversation_id}.md").expanduser()
        try:
            target.write_text(to_markdown(conversation, self.store.messages(self.conversation_id)))
        except OSError as error:
            await self.notice(f"cannot save to {target}: {error.strerror}", error=True)
            return
        await self.notice(f"saved to {target.resolve()}")

    async def list_conversations(self) -> None:
        lines = [f"{c.id:>5}  {c.title}" for c in self.store.conversations()]
        await self.notice("\n".join(["saved conversations (/load ID):"] + lines) if lines else "no saved conversations")

    async def open_conversation(self, conversation_id: int) -> None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            await self.notice(f"no conversation {conversation_id}: /load alone lists them", error=True)
            return
        self.settings = replace(self.settings, system_prompt=conversation.system_prompt)
        await self.reset_view()
        self.conversation_id = conversation_id
        for message in self.store.messages(conversation_id):
            self.entries.append(Entry(message.role, message.content, message.cut, message.id))
            turn = UserTurn(message.content) if message.role == "user" else AssistantTurn(message.content, message.cut)
            await self.view.mount(turn)
        await self.notice(f"conversation {conversation_id}: {conversation.title}")
