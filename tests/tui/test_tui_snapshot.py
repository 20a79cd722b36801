"""SVG snapshots of the main screen (textual pinned; update with `pytest --snapshot-update`).

The pictures are the same on every host: they are drawn from the fake pair, in colour whatever the
environment asks, and as on a host with a GPU, so that a screen that came to depend on the device
would differ from the stored pictures (drawn on CPU hosts) wherever the suite runs."""

from time import perf_counter

import pytest
from helpers.gpus import seen_gpu

from specchat.tui.app import SpecchatApp
from specchat.tui.fake import REPLY, FakeBackend, FakeDSIEngine
from specchat.tui.store import ConversationStore


@pytest.fixture(autouse=True)
def any_host(monkeypatch) -> None:
    # textual reads NO_COLOR as an app starts and then draws every picture without colour
    monkeypatch.delenv("NO_COLOR", raising=False)
    seen_gpu(monkeypatch)


async def steady_cursor(pilot) -> None:
    """The prompt's cursor blinks on a timer, so a picture taken at another moment would differ."""
    pilot.app.prompt.cursor_blink = False
    await pilot.pause()


async def wait_for_reply(pilot) -> None:
    app, deadline = pilot.app, perf_counter() + 5
    while app.session.job is not None or not app.session.entries or app.session.entries[-1].role != "assistant":
        assert perf_counter() < deadline, "no reply"
        await pilot.pause(0.01)


def test_main_screen_after_a_reply(snap_compare, tmp_path):
    """Wide terminal: a system prompt, one exchange streamed by the fake engine, a setting
    change, and the live panels beside the conversation."""
    app = SpecchatApp(FakeBackend(), ConversationStore(tmp_path / "history.sqlite3"))

    async def run_before(pilot) -> None:
        await steady_cursor(pilot)
        for line in ["/system You are a concise Python tutor.", "Write a greeting function."]:
            app.prompt.load_text(line)
            await pilot.press("enter")
        await wait_for_reply(pilot)
        app.prompt.load_text("/budget 32")
        await pilot.press("enter")
        app.prompt.load_text("/te")
        await pilot.press("tab")

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_dsi_panels_after_a_reply(snap_compare, tmp_path):
    """Wide terminal, the dsi engine: its verification jobs and lookahead in the panels, a
    lookahead change, and its worker notice in the transcript. The toast is cleared before
    the picture: it times out, so whether it still shows depends on the machine's load (a
    Pilot test checks it)."""
    app = SpecchatApp(FakeBackend([FakeDSIEngine()]), ConversationStore(tmp_path / "history.sqlite3"))

    async def run_before(pilot) -> None:
        await steady_cursor(pilot)
        app.prompt.load_text("Write a greeting function.")
        await pilot.press("enter")
        await wait_for_reply(pilot)
        app.prompt.load_text("/lookahead 8")
        await pilot.press("enter")
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_restored_conversation_with_a_cut_reply(snap_compare, tmp_path):
    """Narrow terminal (panels hidden), a conversation reopened from the store, its last reply cut."""
    store = ConversationStore(tmp_path / "history.sqlite3")
    conversation = store.new_conversation("greeting", "")
    store.add_message(conversation, "user", "Write a greeting function.")
    store.add_message(conversation, "assistant", REPLY)
    store.add_message(conversation, "user", "Now in Rust, please.")
    store.add_message(conversation, "assistant", "Sure:\n\n```rust\nfn greet(name: &str)", cut=True)
    app = SpecchatApp(FakeBackend(), store, conversation)

    assert snap_compare(app, terminal_size=(80, 30), run_before=steady_cursor)
