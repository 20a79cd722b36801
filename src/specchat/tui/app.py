"""The chat app: a conversation view, live panels and a prompt, over any ChatBackend.

The app draws and listens; the conversation, its settings and its storage are a `Session`,
whose every step returns an `Outcome` for `show` to draw. Decoding runs in a thread worker that
posts one message per engine iteration, so keys are handled while the engine works; cancelling
closes the reply in the UI at once and the worker stops after the iteration in progress.
"""

from functools import partial

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.events import Resize
from textual.widgets import Footer, Header, Static
from textual.worker import Worker, WorkerState

from specchat.tui import commands
from specchat.tui.backend import ChatBackend, Loader
from specchat.tui.chat_input import ChatInput
from specchat.tui.clipboard import last_code_block
from specchat.tui.decoder import decode_reply
from specchat.tui.livestats import stats_report
from specchat.tui.loading import LoadingScreen
from specchat.tui.messages import EngineNotice, IterationArrived, ReplyFinished, describe
from specchat.tui.panels import Panels
from specchat.tui.session import Note, Outcome, Session
from specchat.tui.signals import exit_on_sigterm
from specchat.tui.store import ConversationStore
from specchat.tui.turns import AssistantTurn, UserTurn
from specchat.tui.view import ConversationView

NOTICE_TOAST_S = 12  # an engine notice is a long line: time to read it
SENDING_MID_REPLY = "a reply is being written: Esc stops it, Up recalls your message"


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
        Binding("ctrl+r", "copy('reply')", "Copy reply"),
        Binding("ctrl+o", "copy('code block')", "Copy code"),
        Binding("f2", "toggle_panels", "Panels"),
    ]

    def __init__(self, backend: ChatBackend | None, store: ConversationStore, conversation_id: int | None = None,
                 loader: Loader | None = None) -> None:
        """Give either a ready `backend`, or a `loader` run behind a loading screen."""
        super().__init__()
        if (backend is None) == (loader is None):
            raise ValueError("SpecchatApp needs exactly one of backend and loader")
        self.backend = backend
        self.loader = loader
        self.store = store
        self.resume_id = conversation_id
        self.session: Session | None = None  # made with the backend
        self.reply_turn: AssistantTurn | None = None
        self.job_worker: Worker | None = None
        self.quit_armed = False
        # Held rather than queried: queries look at the active screen, which may be the loader.
        self.view = ConversationView(id="conversation")
        self.panels = Panels(id="panels")
        self.hint = Static("", id="hint")
        self.prompt = ChatInput(store.recent_inputs(), self.complete_line, id="prompt")

    async def run_async(self, **options) -> object:
        """Run until exit; SIGTERM exits as /quit does (see `on_unmount`)."""
        with exit_on_sigterm(self.exit):
            return await super().run_async(**options)

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
        self.panels.fit(self.size.width)
        if self.backend is None:
            await self.push_screen(LoadingScreen(self.loader), callback=self.start)
        else:
            await self.start(self.backend)

    def on_unmount(self) -> None:
        # Every way out ends here (Ctrl+C twice, /quit, SIGTERM): a reply being written is kept,
        # as a cut reply, and the models are released.
        if self.session is not None:
            self.session.close()

    def on_resize(self, event: Resize) -> None:
        self.panels.fit(event.size.width)

    async def start(self, backend: ChatBackend) -> None:
        self.backend = backend
        self.session = Session(backend, self.store)
        self.sub_title = backend.name
        self.panels.transfer_label = backend.transfer_label
        self.panels.show_figures()
        await self.show(Outcome(redraw=True) if self.resume_id is None else self.session.open(self.resume_id))
        if self.store.notice:
            await self.view.note(Note(self.store.notice, error=True))
        self.prompt.focus()

    async def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Workers do not catch: their exceptions arrive here (and in the Textual log).
        if event.state == WorkerState.ERROR and event.worker is self.job_worker and self.is_running:
            await self.end_reply(cut=True)
            await self.view.note(Note(f"decoding failed: {describe(event.worker.error)}", error=True))

    # Drawing what the session did

    async def show(self, outcome: Outcome) -> None:
        """Draw what a session step changed, then its notes, then start the reply it made."""
        session = self.session
        if outcome.redraw:
            await self.view.draw(session.settings.system_prompt, session.entries)
        if outcome.reply_removed:
            await self.view.remove_last_reply()
        if outcome.system_prompt:
            await self.view.show_system_prompt(session.settings.system_prompt)
        self.panels.show_settings(session.settings, session.workers)
        for note in outcome.notes:
            await self.view.note(note)
        if outcome.job is not None:
            self.reply_turn = await self.view.add_reply()
            self.panels.start_reply()
            decode = partial(decode_reply, outcome.job, session.engine_lock, self.post_message)
            self.job_worker = self.run_worker(decode, thread=True, exit_on_error=False, group="decode")

    def is_current(self, reply_id: int) -> bool:
        # Once exit begins the widgets are being torn down: late events are dropped.
        return self.is_running and self.session.is_current(reply_id)

    async def on_iteration_arrived(self, message: IterationArrived) -> None:
        if self.is_current(message.reply_id):
            self.session.record(message.event, message.text)
            await self.panels.record(message.event)
            await self.reply_turn.write(message.text)

    async def on_engine_notice(self, message: EngineNotice) -> None:
        # About the engine, not one reply: shown even when that reply was cut meanwhile. The toast
        # catches the eye mid-reply, the line above the reply keeps it in the transcript.
        if self.is_running:
            self.notify(message.text, title="engine notice", severity="warning", timeout=NOTICE_TOAST_S)
            await self.view.note(Note(message.text), before=self.reply_turn)

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        if self.is_current(message.reply_id):
            await self.reply_turn.write(message.text)
            await self.end_reply(cut=False, tail=message.text)

    async def end_reply(self, cut: bool, tail: str = "") -> None:
        """Close the reply in the UI and store it; the prompt is usable again at once."""
        turn, self.reply_turn, self.job_worker = self.reply_turn, None, None
        await self.panels.redraw.now()  # the reply's last figures, drawn before the session says it ended
        self.session.end_reply(cut, tail)
        await turn.close(cut)

    # Keys and input

    @on(ChatInput.Submitted)
    async def submitted(self, message: ChatInput.Submitted) -> None:
        self.hint.remove_class("-shown")
        self.quit_armed = False
        if commands.is_command(message.text):
            await self.run_command(message.text)
        elif self.replying:
            await self.view.note(Note(SENDING_MID_REPLY, error=True))
        else:
            await self.view.mount(UserTurn(message.text))
            await self.show(self.session.send(message.text))

    @property
    def replying(self) -> bool:
        return self.session is not None and self.session.job is not None

    async def action_stop_reply(self) -> None:
        if self.replying:
            await self.end_reply(cut=True)

    async def action_interrupt(self) -> None:
        if self.quit_armed:
            self.exit()
            return
        self.quit_armed = True
        if self.replying:
            await self.end_reply(cut=True)
            self.notify("Reply stopped. Ctrl+C again quits.")
        else:
            self.notify("Press Ctrl+C again to quit.")

    def on_text_area_changed(self) -> None:
        self.quit_armed = False

    def action_copy(self, what: str) -> None:
        reply = self.view.last_reply()
        text = reply if what == "reply" else last_code_block(reply)
        if text:
            self.copy_to_clipboard(text)
            self.notify(f"{what} copied")
        else:
            self.notify(f"no {what} to copy", severity="warning")

    def action_toggle_panels(self) -> None:
        self.panels.toggle()

    def complete_line(self, line: str) -> tuple[str, list[str]]:
        return commands.complete(line, self.backend.engine_names)

    @on(ChatInput.Completed)
    def show_completions(self, message: ChatInput.Completed) -> None:
        self.hint.update(commands.hint(message.candidates))
        self.hint.add_class("-shown")

    # Slash commands

    async def run_command(self, text: str) -> None:
        try:
            command = commands.parse(text)
        except commands.CommandError as error:
            await self.view.note(Note(str(error), error=True))
            return
        match command:
            case commands.Stats():
                await self.view.note(Note(stats_report(self.session.last_summary, self.panels.stats)))
            case commands.Help():
                await self.view.note(Note(commands.help_text()))
            case commands.Quit():
                self.exit()
            case commands.Attach(text=text, name=name, lines=lines):
                self.prompt.insert(text)  # the prompt, emptied as the command was sent, holds the file
                await self.view.note(Note(f"{name}: {lines} lines in your message; write what to do with it and send"))
            case _:
                await self.show(self.session.execute(command))
