"""The conversation as drawn: the system prompt's line, the turns, and the session's notes."""

from textual.containers import VerticalScroll
from textual.widget import Widget

from specchat.tui.session import Note
from specchat.tui.transcript import Entry
from specchat.tui.turns import AssistantTurn, Notice, SystemTurn, UserTurn


class ConversationView(VerticalScroll):
    async def note(self, note: Note, before: Widget | None = None) -> None:
        await self.mount(Notice(note.text, note.error), before=before)

    async def draw(self, system_prompt: str, entries: list[Entry]) -> None:
        """Draw a whole conversation anew: at the start, after /clear or /load."""
        await self.remove_children()
        if system_prompt:
            await self.mount(SystemTurn(system_prompt))
        for entry in entries:
            turn = UserTurn(entry.content) if entry.role == "user" else AssistantTurn(entry.content, entry.cut)
            await self.mount(turn)

    async def show_system_prompt(self, text: str) -> None:
        shown = self.query(SystemTurn)
        if shown:
            shown.first().update(f"system: {text}")
        else:
            await self.mount(SystemTurn(text), before=0)

    async def add_reply(self) -> AssistantTurn:
        """An empty reply, for decoding to stream into."""
        turn = AssistantTurn()
        await self.mount(turn)
        return turn

    async def remove_last_reply(self) -> None:
        await self.query(AssistantTurn).last().remove()

    def last_reply(self) -> str:
        turns = self.query(AssistantTurn)
        return turns.last().text if turns else ""
