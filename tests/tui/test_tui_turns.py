"""A reply's turn redraws its markdown at most once every REDRAW_S while it streams (tui/redraw.py):
the first text at once, what follows within REDRAW_S at the next redraw, and all of it when the
reply closes; the panels' figures likewise, and as the reply ends."""

import asyncio
from statistics import fmean

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Markdown, Sparkline, Static
from textual.widgets.markdown import MarkdownStream

from specchat.tui import redraw
from specchat.tui.fake import fixed_event
from specchat.tui.panels import (Panels, acceptance_text, jobs_text, settings_text, timing_text,
                                 transfer_text, tree_text)
from specchat.tui.settings import DecodingSettings
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
    monkeypatch.setattr(redraw, "REDRAW_S", 60.0)  # no timer fires while the test runs
    text, shown = stream_reply(["Hello", ",", " world", "!"])
    assert drawn == ["Hello", ", world!"]  # the first at once; the rest together, at close
    assert text == shown == "Hello, world!"


def test_text_after_the_interval_is_drawn_at_once(monkeypatch, drawn):
    monkeypatch.setattr(redraw, "REDRAW_S", 0.0)
    text, shown = stream_reply(["Hello", ",", " world", "!"])
    assert drawn == ["Hello", ",", " world", "!"]
    assert text == shown == "Hello, world!"


def test_a_pending_redraw_comes_when_its_interval_ends(monkeypatch, drawn):
    monkeypatch.setattr(redraw, "REDRAW_S", 0.05)
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


class PanelsApp(App):
    def compose(self) -> ComposeResult:
        yield Panels()


def test_the_panels_record_every_event_and_show_them_at_the_next_redraw(monkeypatch):
    monkeypatch.setattr(redraw, "REDRAW_S", 60.0)
    app = PanelsApp()

    async def scenario():
        async with app.run_test():
            panels = app.query_one(Panels)
            tree_sizes = panels.query_one("#tree-spark", Sparkline)
            for size in (3, 5, 7):
                await panels.record(fixed_event([1, 2], False, tree_size=size, depth=2))
            assert list(panels.stats.tree_sizes) == [3, 5, 7]  # every event recorded
            assert list(tree_sizes.data) == [3]  # the first drawn at once, the rest held
            await panels.redraw.now()  # as the reply ends
            assert list(tree_sizes.data) == [3, 5, 7]

    asyncio.run(scenario())


def test_the_panels_show_every_figure_the_settings_and_dsi_jobs_for_dsi_only():
    app = PanelsApp()

    def text(panels: Panels, name: str) -> str:
        return panels.query_one(f"#{name}", Static).content

    async def scenario():
        async with app.run_test():
            panels = app.query_one(Panels)
            panels.transfer_label = "disk"
            panels.stats.record(fixed_event([1, 2], False, tree_size=5, depth=2))
            panels.show_figures()
            for name, shown in (("accepted", acceptance_text), ("tree", tree_text), ("jobs", jobs_text),
                                ("timing", timing_text)):
                assert text(panels, name) == shown(panels.stats), name
            assert text(panels, "transfer") == transfer_text(panels.stats, "disk")
            sparklines = panels.query(Sparkline)
            assert len(sparklines) == 2 and all(s.summary_function is fmean for s in sparklines)  # a bar: its mean
            jobs = panels.query_one("#jobs-section")
            panels.show_settings(DecodingSettings(engine="dsi"), workers=3)
            assert text(panels, "settings") == settings_text(DecodingSettings(engine="dsi"), 3) and jobs.display
            panels.show_settings(DecodingSettings(), workers=0)
            assert text(panels, "settings") == settings_text(DecodingSettings(), 0) and not jobs.display

    asyncio.run(scenario())


def test_the_panels_follow_the_terminals_width_until_toggled_by_hand():
    app = PanelsApp()

    async def scenario():
        async with app.run_test():
            panels = app.query_one(Panels)
            panels.fit(109)
            assert not panels.display
            panels.fit(110)  # the panels' 38 columns leave the chat 72
            assert panels.display
            panels.toggle()
            panels.fit(160)  # F2 hid them: the width no longer decides
            assert not panels.display
            panels.toggle()
            panels.fit(109)
            assert panels.display

    asyncio.run(scenario())


def test_each_reply_starts_its_own_totals_in_the_panels():
    panels = Panels()
    panels.stats.record(fixed_event([1, 2, 3], False, tree_size=5, depth=2))
    panels.start_reply()
    assert panels.stats.reply_tokens == 0 and panels.stats.last is not None  # the last iteration stays shown
