"""A reply's turn redraws its markdown at most once every REDRAW_S while it streams: the first text
at once, what follows within REDRAW_S at the next redraw, and all of it when the reply closes."""

import asyncio

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

from specchat.tui import turns
from specchat.tui.turns import AssistantTurn


class TurnApp(App):
    def compose(self) -> ComposeResult:
        yield AssistantTurn()


@pytest.fixture
def drawn(monkeypatch) -> list[str]:
    """Every fragment handed to a markdown stream, in order."""
    fragments = []
    write = MarkdownStream.write

    async def record(stream, fragment):
        fragments.append(fragment)
        await write(stream, fragment)

    monkeypatch.setattr(MarkdownStream, "write", record)
    return fragments


def stream_reply(fragments: list[str]) -> tuple[str, str]:
    """Writes `fragments`, then closes the turn: its text, and what its markdown shows."""
    app = TurnApp()

    async def scenario():
        async with app.run_test() as pilot:
            turn = app.query_one(AssistantTurn)
            for fragment in fragments:
                await turn.write(fragment)
            await pilot.pause()
            await turn.close(cut=False)
            return turn.text, app.query_one(Markdown).source

    return asyncio.run(scenario())


def test_text_within_the_interval_waits_for_one_redraw(monkeypatch, drawn):
    monkeypatch.setattr(turns, "REDRAW_S", 60.0)  # no timer fires while the test runs
    text, shown = stream_reply(["Hello", ",", " world", "!"])
    assert drawn == ["Hello", ", world!"]  # the first at once; the rest together, at close
    assert text == shown == "Hello, world!"


def test_text_after_the_interval_is_drawn_at_once(monkeypatch, drawn):
    monkeypatch.setattr(turns, "REDRAW_S", 0.0)
    text, shown = stream_reply(["Hello", ",", " world", "!"])
    assert drawn == ["Hello", ",", " world", "!"]
    assert text == shown == "Hello, world!"


def test_a_pending_redraw_comes_when_its_interval_ends(monkeypatch, drawn):
    monkeypatch.setattr(turns, "REDRAW_S", 0.05)
    app = TurnApp()

    async def scenario():
        async with app.run_test() as pilot:
            turn = app.query_one(AssistantTurn)
            await turn.write("a")
            await turn.write("b")
            assert drawn == ["a"]
            await pilot.pause(0.3)  # the timer fires
            assert drawn == ["a", "b"]
            await turn.close(cut=False)
            assert drawn == ["a", "b"]  # nothing left to draw

    asyncio.run(scenario())
