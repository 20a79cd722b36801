"""The conversation behind the chat app, without a widget: what was said and where it is stored,
the decoding settings, what fits the context, the reply being written, and the commands that
change them.

Every step returns an `Outcome`, plain data the app only draws: the session is tested without
Pilot, and any front end can drive it. Engines are reached through the `Engine` protocol alone.
"""

import threading
from dataclasses import dataclass, replace
from itertools import count
from time import perf_counter

from specchat.decoding.events import AUTO, IterationEvent, LiveSettings
from specchat.decoding.penalties import counted_from, settings_penalties
from specchat.errors import ContextOverflow, SpecchatError
from specchat.paths import expanded
from specchat.summary import Summary, summarize
from specchat.tui import commands
from specchat.tui.backend import ChatBackend, settings_for
from specchat.tui.context import fit_prompt
from specchat.tui.export import to_markdown
from specchat.tui.reply import ReplyJob
from specchat.tui.store import ConversationStore
from specchat.tui.transcript import Entry, system_messages, title_of

# Settings an engine reads while it decodes, and when a change made mid-reply takes effect.
LIVE_FROM = {"budget": "the next iteration", "depth": "the next iteration", "lookahead": "the next job"}
BUSY = "a reply is being written: press Esc to stop it first"


@dataclass(frozen=True)
class Note:
    """A line (or a few) for the transcript: what a step did, or why it was refused."""

    text: str
    error: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one step changed, in the order a front end shows it."""

    redraw: bool = False  # the conversation was replaced (/clear, /load): draw `entries` anew
    reply_removed: bool = False  # /retry deleted the last reply, to write it again
    system_prompt: bool = False  # the system prompt changed
    notes: tuple[Note, ...] = ()
    job: ReplyJob | None = None  # a reply to decode, shown after the notes


def says(text: str, error: bool = False) -> Outcome:
    return Outcome(notes=(Note(text, error),))


class Session:
    def __init__(self, backend: ChatBackend, store: ConversationStore) -> None:
        self.backend = backend
        self.store = store
        self.settings = backend.settings
        self.conversation_id: int | None = None  # created with the first message
        self.entries: list[Entry] = []
        self.dropped = 0  # oldest messages currently left out of the context
        self.job: ReplyJob | None = None  # the reply being written
        self.reply_text = ""  # of the reply being written, or of the last one
        self.reply_events: list[IterationEvent] = []  # likewise
        self.reply_started = 0.0
        self.reply_message_id: int | None = None  # the stored row of the reply being written
        self.last_summary: Summary | None = None
        self.reply_ids = count(1)
        self.engine_lock = threading.Lock()  # one generate() at a time, see decoder.decode_reply

    @property
    def workers(self) -> int:
        """The engine's target workers (dsi); 0 for engines without."""
        return self.backend.engine.live_settings().workers or 0

    # Replies

    def send(self, text: str) -> Outcome:
        """Add the user's message and start its reply; refused while a reply is written (the app
        checks first, to keep the message in the prompt)."""
        if self.job:
            return says(BUSY, error=True)
        if self.conversation_id is None:
            self.conversation_id = self.store.new_conversation(title_of(text), self.settings.system_prompt)
        self.add_entry("user", text, cut=False)
        return self.start_reply()

    def start_reply(self) -> Outcome:
        """A reply to the conversation as it stands, fitted to the context (oldest turns out first)."""
        turns = [entry.as_message() for entry in self.entries]
        try:
            prompt = fit_prompt(system_messages(self.settings.system_prompt), turns, self.backend.encode,
                                self.backend.context, self.settings.max_tokens, self.dropped)
        except ContextOverflow as error:
            return says(str(error), error=True)
        dropped = f"context full: the oldest {prompt.dropped} messages are left out (system prompt kept)"
        notes = (Note(dropped),) if prompt.dropped > self.dropped else ()
        self.dropped = prompt.dropped
        settings = self.settings
        penalties = settings_penalties(vars(settings), self.backend.breakers)
        sampling = counted_from(self.settings.sampling(), penalties, prompt.ids)
        # the code the user's message (the last turn: a reply or a retry follows it) quotes
        sampling = replace(sampling, prediction=self.backend.prediction(turns[-1]["content"]))
        if self.settings.reply_form is not None:
            sampling = replace(sampling, guide=self.backend.guide(self.settings.reply_form))
        self.job = ReplyJob(next(self.reply_ids), self.backend.engine, prompt.ids, prompt.max_new_tokens,
                            sampling, self.backend.new_text_stream())
        self.reply_text, self.reply_events, self.reply_started = "", [], perf_counter()
        # Stored from its start as a cut reply and kept up to date, so that a crash (kill -9, power)
        # leaves the text written so far, marked cut.
        self.reply_message_id = self.store.add_message(self.conversation_id, "assistant", "", cut=True)
        return Outcome(notes=notes, job=self.job)

    def is_current(self, reply_id: int) -> bool:
        """Whether `reply_id` is the reply being written: a cut reply's late events are dropped."""
        return self.job is not None and self.job.id == reply_id

    def record(self, event: IterationEvent, text: str) -> None:
        """One iteration of the reply being written, and the text it made stable."""
        self.reply_events.append(event)
        if text:
            self.reply_text += text
            self.store.update_message(self.reply_message_id, self.reply_text, cut=True)

    def end_reply(self, cut: bool, tail: str = "") -> None:
        """Stop decoding and store the reply with `tail` (the text held back to the end); the
        decoding thread stops after the iteration in progress."""
        self.job.cancel.set()
        self.job = None
        self.reply_text += tail
        self.store.update_message(self.reply_message_id, self.reply_text, cut)
        self.entries.append(Entry("assistant", self.reply_text, cut, self.reply_message_id))
        self.last_summary = summarize(self.reply_events, perf_counter() - self.reply_started)

    def add_entry(self, role: str, content: str, cut: bool) -> None:
        message_id = self.store.add_message(self.conversation_id, role, content, cut)
        self.entries.append(Entry(role, content, cut, message_id))

    def close(self) -> None:
        """At exit: keep a reply being written, as cut; close the backend once its engine is idle."""
        if self.job is not None:
            self.end_reply(cut=True)
        with self.engine_lock:  # waits for the cut reply's iteration in progress
            self.backend.close()

    # Commands

    def execute(self, command: commands.Command) -> Outcome:
        """Run a slash command on the session: all but /stats, /help and /quit, the app's own."""
        match command:
            case commands.SetSetting(field=field, value=value):
                return self.change(field, value)
            case commands.Clear():
                return self.clear()
            case commands.Retry():
                return self.retry()
            case commands.Save(path=path):
                return self.save(path)
            case commands.Load(conversation_id=None):
                return self.list_conversations()
            case commands.Load(conversation_id=conversation_id):
                return self.open(conversation_id)
        raise ValueError(f"{command} is not a session command")

    def change(self, field: str, value: object) -> Outcome:
        """Set a DecodingSettings `field`, as checked by the command parser (bar engine names)."""
        engine = self.backend.engine
        match field:
            case "engine":
                return self.switch_engine(value)
            case "system_prompt":
                return self.set_system_prompt(value)
            case "lookahead" if engine.live_settings().lookahead is None:
                # Refused rather than kept for later: dsi runs alone (/engine never offers it), so
                # a lookahead set on another engine would never apply.
                return says(f"/lookahead applies to the dsi engine only, not {engine.name}", error=True)
            case "budget" if isinstance(value, int) and value > self.backend.max_budget:
                return says(f"/budget {value} is past the {self.backend.max_budget}-token tree this run's memory plan "
                            f"made room for: restart with --budget {value} to plan for it", error=True)
            case "reply_form" if value is not None and (refusal := self.form_refusal(value)):
                return says(refusal, error=True)
            case "budget" if value == AUTO and not self.sizes_trees():
                return says(f"/budget auto is not available for {engine.name} in this run: only specexec sizes "
                            "its own trees, when `specchat run` starts with --budget auto", error=True)
        self.settings = self.settings.with_value(field, value)
        if field in LIVE_FROM:
            self.apply_live_settings()
        when = f"from {LIVE_FROM.get(field, 'the next reply')}" if self.job else ""
        if field == "reply_form":
            form = "free text" if value is None else "JSON objects" if value == commands.ANY_OBJECT else \
                "in the grammar's language" if isinstance(value, str) else "JSON valid under the schema"
            return says(f"replies: {form} {when}".rstrip())
        shown = "off" if value is None else value
        return says(f"{field.replace('_', '-')} set to {shown} {when}".rstrip())

    def form_refusal(self, form: dict | str) -> str | None:
        """Why replies cannot keep to `form` here (it does not compile), in one line; None if they can."""
        try:
            self.backend.guide(form)
        except SpecchatError as error:
            return str(error)
        return None

    def apply_live_settings(self) -> None:
        # An engine takes only what it reads (autoregressive nothing): the other values wait in
        # the settings until an engine that reads them is chosen.
        settings = self.settings
        self.backend.engine.apply(LiveSettings(budget=settings.budget, depth=settings.depth,
                                               lookahead=settings.lookahead))

    def sizes_trees(self) -> bool:
        """Whether the engine takes --budget auto: offered it, it either sizes its trees or keeps
        its own size (and then nothing changed)."""
        engine = self.backend.engine
        engine.apply(LiveSettings(budget=AUTO))
        return engine.live_settings().budget == AUTO

    def switch_engine(self, name: str) -> Outcome:
        if name not in self.backend.engine_names:
            return says(f"unknown engine '{name}': choose one of {', '.join(self.backend.engine_names)}", error=True)
        previous = self.backend.engine
        engine = self.backend.use_engine(name)
        if engine is not previous:  # its kept caches would only hold memory (a reply running keeps its own)
            previous.forget()
        self.apply_live_settings()
        # The settings show what the new engine holds: one that cannot size its trees keeps a size.
        self.settings = settings_for(engine, self.settings)
        return says(f"engine set to {name}" + (" from the next reply" if self.job else ""))

    def set_system_prompt(self, text: str) -> Outcome:
        self.settings = replace(self.settings, system_prompt=text)
        if self.conversation_id is not None:
            self.store.set_system_prompt(self.conversation_id, text)
        return Outcome(system_prompt=True, notes=(Note("system prompt set"),))

    def clear(self) -> Outcome:
        """A new conversation, stored with its first message."""
        if self.job:
            return says(BUSY, error=True)
        self.use_conversation(None, [])
        return Outcome(redraw=True, notes=(Note("new conversation"),))

    def retry(self) -> Outcome:
        """Write the last reply again (or the missing one, after a failure or an overflow)."""
        if self.job:
            return says(BUSY, error=True)
        if not any(entry.role == "user" for entry in self.entries):
            return says("nothing to retry yet", error=True)
        removed = self.entries[-1].role == "assistant"
        if removed:
            self.store.delete_message(self.entries.pop().message_id)
        return replace(self.start_reply(), reply_removed=removed)

    def save(self, path: str | None) -> Outcome:
        """Export the conversation as markdown, to `path` or specchat-ID.md."""
        if self.conversation_id is None:
            return says("nothing to save yet", error=True)
        conversation = self.store.conversation(self.conversation_id)
        try:
            target = expanded(path or f"specchat-{self.conversation_id}.md", "/save")
            target.write_text(to_markdown(conversation, self.store.messages(self.conversation_id)))
        except SpecchatError as error:
            return says(str(error), error=True)
        except OSError as error:
            return says(f"cannot save to {target}: {error.strerror}", error=True)
        except ValueError:  # a name no file can have (a NUL byte)
            return says(f"/save {path!r}: not a file name", error=True)
        return says(f"saved to {target.resolve()}")

    def list_conversations(self) -> Outcome:
        if self.job:
            return says(BUSY, error=True)
        lines = [f"{c.id:>5}  {c.title}" for c in self.store.conversations()]
        return says("\n".join(["saved conversations (/load ID):"] + lines) if lines else "no saved conversations")

    def open(self, conversation_id: int) -> Outcome:
        """Reopen a stored conversation, with its system prompt."""
        if self.job:
            return says(BUSY, error=True)
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return says(f"no conversation {conversation_id}: /load alone lists them", error=True)
        self.settings = replace(self.settings, system_prompt=conversation.system_prompt)
        stored = self.store.messages(conversation_id)
        self.use_conversation(conversation_id, [Entry(m.role, m.content, m.cut, m.id) for m in stored])
        return Outcome(redraw=True, notes=(Note(f"conversation {conversation_id}: {conversation.title}"),))

    def use_conversation(self, conversation_id: int | None, entries: list[Entry]) -> None:
        """Another conversation: the engine's kept caches, of the old one, are dropped (the new
        one's first reply prefills it once; later turns reuse that)."""
        self.backend.engine.forget()
        self.conversation_id = conversation_id
        self.entries = entries
        self.dropped = 0
