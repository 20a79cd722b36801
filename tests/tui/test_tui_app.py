"""The chat app driven with Pilot against the fake engine: sending, streaming, cancelling, keys,
slash commands, history across restarts, the live panels (dsi's too), engine notices and the
loading screen."""

import asyncio
import html
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from time import perf_counter, sleep

import pytest
from textual import events
from textual.widgets import Log, ProgressBar, Sparkline, Static

import specchat
from specchat.decoding.dry import Dry
from specchat.errors import SpecchatError
from specchat.tui.app import SpecchatApp
from specchat.tui.fake import REPLY, WORKER_NOTICE, FakeBackend, FakeDSIEngine, FakeEngine, Gate
from specchat.tui.loading import LoadCancelled, LoadingScreen
from specchat.tui.reply import ReplyJob
from specchat.tui.store import ConversationStore
from specchat.tui.turns import AssistantTurn, Notice, SystemTurn, UserTurn

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

SIZE = (120, 40)
HANG_S = 30  # bound on a wait that only guards against a hang: the app answers in well under a second


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "history.sqlite3"


def make_app(store_path, engines=None, **backend_options) -> SpecchatApp:
    return SpecchatApp(FakeBackend(engines, **backend_options), ConversationStore(store_path))


def screen_text(app) -> str:
    """What the terminal shows, as text (the screenshot's SVG without its markup)."""
    return html.unescape(re.sub(r"<[^>]+>", "", app.export_screenshot())).replace("\xa0", " ")


def run(scenario):
    asyncio.run(scenario())


async def wait_until(pilot, condition) -> None:
    deadline = perf_counter() + HANG_S
    while not condition():
        assert perf_counter() < deadline, "timed out waiting for the app"
        await pilot.pause(0.01)


@asynccontextmanager
async def held(app: SpecchatApp, gate: Gate) -> AsyncIterator:
    """Pilot over `app`, whose engine `gate` holds; the gate opens before the app shuts down
    (its exit waits for the engine's iteration in progress), whatever the test did."""
    async with app.run_test(size=SIZE) as pilot:
        try:
            yield pilot
        finally:
            gate.open()


def open_when_cut(job: ReplyJob, gate: Gate) -> None:
    """Open `gate` once `job` is cut: for a way out (/quit, SIGTERM) that cuts the reply and then
    waits for the engine in one call, leaving the test no moment to open it."""
    def open_gate() -> None:
        job.cancel.wait(HANG_S)  # past that, the test's own checks say the reply was never cut
        gate.open()

    threading.Thread(target=open_gate, daemon=True).start()


def replying_done(app) -> bool:
    return app.session.job is None and bool(app.session.entries) and app.session.entries[-1].role == "assistant"


async def say(pilot, text: str) -> None:
    pilot.app.prompt.load_text(text)
    await pilot.press("enter")


async def ask(pilot, text: str) -> None:
    await say(pilot, text)
    await wait_until(pilot, lambda: replying_done(pilot.app))


async def first_iteration_shown(pilot, gate: Gate) -> None:
    """Let the held engine run one iteration, then wait until its text is on screen: the reply
    stops there until the gate opens."""
    gate.allow(1)
    await wait_until(pilot, lambda: pilot.app.reply_turn is not None and pilot.app.reply_turn.text)


def notices(app) -> list[Notice]:
    return list(app.query(Notice))


def last_notice(app) -> Notice:
    return notices(app)[-1]


def test_send_streams_the_reply_and_saves_both_turns(store_path):
    gate = Gate()
    app = make_app(store_path, [FakeEngine(gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            await pilot.press(*"hello", "enter")
            await first_iteration_shown(pilot, gate)
            assert REPLY.startswith(app.reply_turn.text) and len(app.reply_turn.text) < len(REPLY)
            assert app.session.job is not None  # shown while it is being written
            gate.open()
            await wait_until(pilot, lambda: replying_done(app))
            assert [turn.text for turn in app.query(UserTurn)] == ["hello"]
            [reply] = app.query(AssistantTurn)
            assert reply.text == REPLY and not reply.cut
            assert app.prompt.text == "" and app.prompt.has_focus
            engine = app.backend.engine
            assert engine.calls[0][0] == app.backend.encode([{"role": "user", "content": "hello"}])
            messages = app.store.messages(app.session.conversation_id)
            assert [(m.role, m.content, m.cut) for m in messages] == [
                ("user", "hello", False), ("assistant", REPLY, False)
            ]

    run(scenario)


def test_escape_cuts_the_reply_at_once_and_keeps_the_partial_text(store_path):
    gate = Gate()
    app = make_app(store_path, [FakeEngine(gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            await say(pilot, "tell me")
            await first_iteration_shown(pilot, gate)
            await pilot.press("escape")
            # The prompt is usable at once, while the engine is still held in its second iteration.
            assert app.session.job is None and app.session.engine_lock.locked()
            [reply] = app.query(AssistantTurn)
            assert reply.cut and 0 < len(reply.text) < len(REPLY)
            saved = app.store.messages(app.session.conversation_id)[-1]
            assert (saved.role, saved.content, saved.cut) == ("assistant", reply.text, True)
            # Let the engine run free: the worker stops after the iteration in progress, the
            # second, and frees the engine.
            gate.open()
            await wait_until(pilot, lambda: not app.session.engine_lock.locked())
            assert gate.passed == 2
            await pilot.pause()
            assert reply.text == saved.content  # nothing arrives after the cut
            await say(pilot, "again")
            await wait_until(pilot, lambda: len(app.backend.engine.calls) == 2)

    run(scenario)


def test_ctrl_c_stops_the_reply_then_quits(store_path):
    gate = Gate()
    app = make_app(store_path, [FakeEngine(gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            await say(pilot, "tell me")
            await first_iteration_shown(pilot, gate)
            await pilot.press("ctrl+c")
            assert app.session.job is None and app.query(AssistantTurn).last().cut
            assert app.is_running
            gate.open()  # the exit waits for the engine's iteration in progress
            await pilot.press("ctrl+c")
            await wait_until(pilot, lambda: not app.is_running)

    run(scenario)


def test_quitting_mid_reply_saves_the_partial_reply(store_path):
    gate = Gate()
    app = make_app(store_path, [FakeEngine(gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            await say(pilot, "tell me")
            await first_iteration_shown(pilot, gate)
            open_when_cut(app.session.job, gate)
            await say(pilot, "/quit")
            await wait_until(pilot, lambda: not app.is_running)

    run(scenario)
    [conversation] = ConversationStore(store_path).conversations()
    reply = ConversationStore(store_path).messages(conversation.id)[-1]
    assert reply.role == "assistant" and reply.cut and 0 < len(reply.content) < len(REPLY)


@pytest.mark.parametrize("keys", [["ctrl+c", "ctrl+c"], ["/quit"]], ids=["ctrl+c twice", "/quit"])
def test_every_way_out_closes_the_backend_once(store_path, keys):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await ask(pilot, "hi")
            assert app.backend.closes == 0
            for key in keys:
                await (say(pilot, key) if key.startswith("/") else pilot.press(key))
            await wait_until(pilot, lambda: not app.is_running)

    run(scenario)
    assert app.backend.closes == 1


REPLYING_CHILD = textwrap.dedent("""
    import signal
    import sys
    import threading
    from pathlib import Path
    from specchat.tui.app import SpecchatApp
    from specchat.tui.fake import FakeBackend, FakeEngine, Gate
    from specchat.tui.store import ConversationStore

    store_path, replying = Path(sys.argv[1]), Path(sys.argv[2])
    gate = Gate()
    backend = FakeBackend([FakeEngine(gate=gate)])
    app = SpecchatApp(backend, ConversationStore(store_path))

    def open_when_cut(job):
        # The engine stays held after its first iteration until the app's exit cuts the reply.
        job.cancel.wait()
        gate.open()

    async def reply_then_wait(pilot):
        app.prompt.load_text("tell me")
        await pilot.press("enter")
        gate.allow(1)
        while not (app.reply_turn and app.reply_turn.text):
            await pilot.pause(0.01)
        threading.Thread(target=open_when_cut, args=(app.session.job,), daemon=True).start()
        replying.touch()

    # A suite started in the background by a shell without job control inherits SIGINT ignored, and
    # Python then leaves it so: the child takes SIGINT as a terminal's process would.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    app.run(headless=True, auto_pilot=reply_then_wait)
    print(backend.closes)
""")


def replying_child(store_path: Path) -> subprocess.Popen:
    """The app in a process of its own (a signal it failed to catch would end the test run),
    once its reply has shown some text."""
    replying = store_path.parent / "replying"
    env = {**os.environ, "PYTHONPATH": str(Path(specchat.__file__).parents[1])}
    child = subprocess.Popen([sys.executable, "-c", REPLYING_CHILD, str(store_path), str(replying)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = perf_counter() + 60
    while not replying.exists():
        assert child.poll() is None and perf_counter() < deadline, child.stderr.read() if child.poll() else "no reply"
        sleep(0.05)
    return child


def stored_reply(store_path: Path):
    store = ConversationStore(store_path)
    [conversation] = store.conversations()
    return store.messages(conversation.id)[-1]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_keep_the_reply_and_close_the_backend(store_path, number):
    """SIGTERM through tui/signals.py; SIGINT (a `kill -INT`: in the app's raw terminal Ctrl+C is a
    key) through asyncio's runner, which cancels the app's task: both end as /quit does."""
    child = replying_child(store_path)
    child.send_signal(number)
    out, err = child.communicate(timeout=60)
    assert (child.returncode, out) == (0, "1\n"), err
    reply = stored_reply(store_path)
    assert reply.role == "assistant" and reply.cut and 0 < len(reply.content) < len(REPLY)


def test_a_reply_killed_mid_way_is_there_as_cut_after_a_restart(store_path):
    child = replying_child(store_path)
    child.kill()  # SIGKILL: nothing runs at exit
    child.communicate(timeout=60)
    reply = stored_reply(store_path)
    assert reply.role == "assistant" and reply.cut and 0 < len(reply.content) < len(REPLY)
    assert REPLY.startswith(reply.content)
    store = ConversationStore(store_path)
    app = SpecchatApp(FakeBackend(), store, store.last_conversation_id())  # as `specchat run --continue`

    async def scenario():
        async with app.run_test(size=SIZE):
            assert [t.text for t in app.query(UserTurn)] == ["tell me"]
            [turn] = app.query(AssistantTurn)
            assert turn.text == reply.content and app.session.entries[-1].cut

    run(scenario)


def test_ctrl_c_when_idle_asks_for_a_second_press(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+c")
            assert app.is_running
            await pilot.press("x")  # typing disarms the quit
            await pilot.press("ctrl+c")
            assert app.is_running
            await pilot.press("ctrl+c")
            await wait_until(pilot, lambda: not app.is_running)

    run(scenario)


def test_sending_during_a_reply_is_refused_without_losing_it(store_path):
    gate = Gate()  # never let through while the test runs: the first reply is being written throughout
    app = make_app(store_path, [FakeEngine(gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            await say(pilot, "first")
            await say(pilot, "second")
            assert "Esc stops it" in last_notice(app).text and last_notice(app).has_class("error")
            assert len(app.backend.engine.calls) == 1
            await pilot.press("escape", "up")
            assert app.prompt.text == "second"

    run(scenario)


def test_input_keys_newlines_recall_paste_and_completion(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")
            assert app.prompt.text == "a\nb\nc"
            await pilot.press("enter")
            await wait_until(pilot, lambda: replying_done(app))
            assert app.session.entries[0].content == "a\nb\nc"
            app.post_message(events.Paste("pasted\nlines"))
            await pilot.pause()
            assert app.prompt.text == "pasted\nlines" and app.session.job is None
            app.prompt.clear()
            await pilot.press("up")
            assert app.prompt.text == "a\nb\nc"
            await pilot.press("down")
            assert app.prompt.text == ""
            await pilot.press(*"/bu", "tab")
            assert app.prompt.text == "/budget "
            app.prompt.load_text("/s")
            await pilot.press("tab")
            hint = app.query_one("#hint", Static)
            assert hint.display and "/system" in str(hint.content) and "/stats" in str(hint.content)
            app.prompt.load_text("/engine a")
            await pilot.press("tab")
            assert app.prompt.text == "/engine autoregressive"

    run(scenario)


def test_copy_keys_put_the_reply_and_its_code_on_the_clipboard(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+r")
            assert app.clipboard == ""
            await ask(pilot, "code please")
            await pilot.press("ctrl+r")
            assert app.clipboard == REPLY
            await pilot.press("ctrl+o")
            assert app.clipboard == 'def greet(name):\n    return f"hello {name}"'

    run(scenario)


INVALID_COMMANDS = [
    "/budget -5", "/budget abc", "/budget", "/temp 7", "/top-p 0", "/depth 300", "/max-tokens 0",
    "/seed -1", "/engine warp", "/clear now", "/load abc", "/load 99", "/frobnicate", "/retry", "/save",
    "/lookahead 0", "/lookahead 8",  # the latter: specexec has no lookahead
]


def test_invalid_commands_say_why_inline_and_change_nothing(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            engine = app.backend.engine
            before = (app.session.settings, engine.budget, engine.max_depth, app.backend.engine)
            for text in INVALID_COMMANDS:
                await say(pilot, text)
                notice = last_notice(app)
                assert notice.has_class("error") and "\n" not in notice.text, text
                assert (app.session.settings, engine.budget, engine.max_depth, app.backend.engine) == before, text
            assert app.session.entries == [] and app.session.conversation_id is None
            assert len(notices(app)) == len(INVALID_COMMANDS)

    run(scenario)


def test_setting_commands_change_the_next_reply(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            spec = app.backend.engine
            for text in ["/budget 64", "/depth 8", "/temp 0.2", "/top-p 0.5", "/top-k 3", "/min-p 0.1",
                         "/typical-p 0.8", "/seed 7", "/max-tokens 10", "/repeat-penalty 1.2", "/repeat-last-n 4",
                         "/frequency-penalty 0.3", "/mirostat 1", "/top-n-sigma 2", "/xtc-probability 0.5",
                         "/xtc-threshold 0.2", "/dry-multiplier 0.8", "/dynatemp-range 0.3", "/dynatemp-exponent 2"]:
                await say(pilot, text)
                assert not last_notice(app).has_class("error"), text
            assert (spec.budget, spec.max_depth) == (64, 8)
            await ask(pilot, "go")
            prompt_ids, max_new_tokens, sampling = spec.calls[-1]
            assert (max_new_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (10, 0.2, 0.5, 7)
            assert (sampling.top_k, sampling.min_p, sampling.typical_p) == (3, 0.1, 0.8)
            assert (sampling.top_n_sigma, sampling.xtc_probability, sampling.xtc_threshold) == (2.0, 0.5, 0.2)
            assert (sampling.dynatemp_range, sampling.dynatemp_exponent) == (0.3, 2.0)
            assert sampling.mirostat.spec.version == 1
            repeats = sampling.penalties  # counted from the prompt: its last 4 tokens
            assert (repeats.penalties.repeat, repeats.penalties.frequency) == (1.2, 0.3)
            assert repeats.penalties.dry == Dry(0.8, 1.75, 2, -1)  # the fake backend's tokenizer writes no breaker
            assert list(repeats.repeated.tokens) == list(repeats.counted.tokens) == prompt_ids[-4:]
            assert app.session.entries[-1].content == REPLY[:10]
            assert "budget 64 · depth 8" in str(app.query_one("#settings", Static).content)
            extras = ("top-k 3 · min-p 0.1 · typical-p 0.8 · top-n-sigma 2 · xtc 0.5 (threshold 0.2) · dynatemp ±0.3 "
                      "(exponent 2) · mirostat 1 (tau 5, eta 0.1)")
            assert extras in str(app.query_one("#settings", Static).content)

            await say(pilot, "/seed off")
            assert app.session.settings.seed is None
            await say(pilot, "/engine autoregressive")
            baseline = app.backend.engine
            assert baseline.name == "autoregressive" and baseline.budget == 64
            await ask(pilot, "again")
            assert len(baseline.calls) == 1 and len(spec.calls) == 1

            await say(pilot, "/system Be brief.")
            assert app.query_one(SystemTurn).content == "system: Be brief."
            await ask(pilot, "third")
            assert baseline.calls[-1][0][:len("<system>Be brief.")] == app.backend.tokenizer.encode("<system>Be brief.")
            assert app.store.conversation(app.session.conversation_id).system_prompt == "Be brief."

    run(scenario)


def test_conversation_commands(store_path, tmp_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await ask(pilot, "first question")
            first = app.session.conversation_id
            await say(pilot, "/retry")
            await wait_until(pilot, lambda: replying_done(app))
            assert len(app.query(AssistantTurn)) == 1
            assert [m.role for m in app.store.messages(first)] == ["user", "assistant"]
            assert len(app.backend.engine.calls) == 2

            await say(pilot, "/stats")
            assert "tokens in" in last_notice(app).text and "mean accepted" in last_notice(app).text
            prompt = app.backend.engine.calls[-1][0]
            assert f"prefill {len(prompt)} tokens in 0.01 s" in last_notice(app).text
            target = tmp_path / "out.md"
            await say(pilot, f"/save {target}")
            assert target.read_text().startswith("# first question\n\n## User\n\nfirst question")
            await say(pilot, f"/save {tmp_path}/missing/dir/out.md")
            assert last_notice(app).has_class("error") and "cannot save" in last_notice(app).text

            await say(pilot, "/clear")
            assert not app.query(UserTurn) and app.session.conversation_id is None
            await ask(pilot, "second conversation")
            assert app.session.conversation_id != first

            await say(pilot, "/load")
            assert "first question" in last_notice(app).text and "second conversation" in last_notice(app).text
            await say(pilot, f"/load {first}")
            assert app.session.conversation_id == first
            assert [t.text for t in app.query(UserTurn)] == ["first question"]

            await say(pilot, "/help")
            assert "/max-tokens N" in last_notice(app).text and "Esc stop reply" in last_notice(app).text
            assert "/lookahead N" in last_notice(app).text
            await say(pilot, "/quit")
            await wait_until(pilot, lambda: not app.is_running)

    run(scenario)


def test_a_file_command_puts_the_file_in_the_message_sent_and_stored(store_path, tmp_path):
    source = tmp_path / "prime.py"
    source.write_text("def is_prime(n):\n    return n > 1\n")
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await say(pilot, f"/file {source}")
            assert app.prompt.text == f"`{source}`:\n```python\ndef is_prime(n):\n    return n > 1\n```\n"
            assert last_notice(app).text.startswith(f"{source}: 2 lines in your message")
            app.prompt.insert("Make it correct for 4.")  # the cursor waits below the block
            await pilot.press("enter")
            await wait_until(pilot, lambda: replying_done(app))
            sent = app.store.messages(app.session.conversation_id)[0].content
            assert sent == f"`{source}`:\n```python\ndef is_prime(n):\n    return n > 1\n```\nMake it correct for 4."
            await say(pilot, f"/file {tmp_path}")  # a folder: one line, and the prompt stays empty
            assert last_notice(app).has_class("error") and "a directory" in last_notice(app).text
            assert app.prompt.text == ""

    run(scenario)


def test_history_survives_a_restart(store_path):
    first_app = make_app(store_path)

    async def first_session():
        async with first_app.run_test(size=SIZE) as pilot:
            await say(pilot, "/system Answer in French.")
            await ask(pilot, "what is a list?")
            await say(pilot, "/quit")

    run(first_session)
    store = ConversationStore(store_path)
    second_app = SpecchatApp(FakeBackend(), store, store.last_conversation_id())

    async def second_session():
        async with second_app.run_test(size=SIZE) as pilot:
            assert [t.text for t in second_app.query(UserTurn)] == ["what is a list?"]
            assert [t.text for t in second_app.query(AssistantTurn)] == [REPLY]
            assert second_app.query_one(SystemTurn).content == "system: Answer in French."
            await pilot.press("up")
            assert second_app.prompt.text == "what is a list?"
            await ask(pilot, "and a tuple?")
            sent = second_app.backend.encode([
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "what is a list?"},
                {"role": "assistant", "content": REPLY},
                {"role": "user", "content": "and a tuple?"},
            ])
            assert second_app.backend.engine.calls[-1][0] == sent

    run(second_session)


def test_an_unreadable_history_is_moved_aside_with_a_notice_and_the_chat_works(store_path):
    store_path.write_bytes(b"garbage " * 1000)
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            notes = [str(n.content) for n in app.query(Notice)]
            assert len(notes) == 1 and notes[0].startswith("the history file could not be read")
            await ask(pilot, "still there?")
            assert [t.text for t in app.query(AssistantTurn)] == [REPLY]

    run(scenario)
    assert len(list(store_path.parent.glob("history.sqlite3.corrupt-*"))) == 1


def test_oldest_turns_leave_the_context_with_a_notice(store_path):
    # 300 tokens of context, 100 kept for the reply: three exchanges do not fit.
    app = make_app(store_path, context=300)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await say(pilot, "/max-tokens 100")
            await say(pilot, "/system S")
            for question in ["q1", "q2", "q3"]:
                await ask(pilot, question)
            assert "context full: the oldest 2 messages are left out" in last_notice(app).text
            prompt = app.backend.tokenizer.decode(app.backend.engine.calls[-1][0])
            assert prompt.startswith("<system>S<user>q2") and "q1" not in prompt
            await say(pilot, "x" * 500)
            assert "leaves no room for a reply in the 300-token context" in last_notice(app).text

    run(scenario)


def test_panels_follow_every_iteration_and_a_live_budget_change(store_path):
    gate = Gate()
    app = make_app(store_path, [FakeEngine(reply=REPLY[:50], gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            panels = app.panels
            assert panels.display  # wide terminal
            await say(pilot, "go")
            for seen in (1, 3):
                gate.allow(seen - gate.allowed)
                await wait_until(pilot, lambda: len(app.session.reply_events) == seen)
                assert panels.stats.iterations == seen
                assert list(panels.stats.accepted) == [e.accepted for e in app.session.reply_events]
            await say(pilot, "/budget 99")  # while the engine is held before its fourth iteration
            assert "from the next iteration" in last_notice(app).text
            gate.open()
            await wait_until(pilot, lambda: replying_done(app))
            sizes = [e.tree_size for e in app.session.reply_events]
            assert len(sizes) > 4 and sizes == [16] * 3 + [99] * (len(sizes) - 3)
            assert app.query_one("#tree-spark", Sparkline).data == sizes
            assert app.query_one("#accepted-spark", Sparkline).data == [e.accepted for e in app.session.reply_events]
            assert str(app.query_one("#tree", Static).content).startswith("size 99")
            assert not app.query_one("#jobs-section").display  # specexec sends no verification jobs
            mean = sum(e.accepted for e in app.session.reply_events) / len(app.session.reply_events)
            assert f"mean {mean:.2f}" in str(app.query_one("#accepted", Static).content)
            await pilot.press("f2")
            assert not panels.display

    run(scenario)


def test_panels_start_hidden_on_a_narrow_terminal(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=(80, 30)) as pilot:
            assert not app.panels.display
            await pilot.press("f2")
            assert app.panels.display

    run(scenario)


def test_transfer_panel_shows_label_and_bandwidth(store_path):
    backend = FakeBackend([FakeEngine(transfer_bytes=30_000_000)])
    backend.transfer_label = "RAM"
    app = SpecchatApp(backend, ConversationStore(store_path))

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await ask(pilot, "go")
            assert str(app.query_one("#transfer", Static).content) == "transfer RAM: 10.0 ms\n3.00 GB/s · stall 0.0 ms\nlink idle 25%"

    run(scenario)


def test_a_failing_engine_cuts_the_reply_and_says_why(store_path):
    class BrokenEngine(FakeEngine):
        def generate(self, prompt_ids, max_new_tokens, sampling):
            for number, event in enumerate(super().generate(prompt_ids, max_new_tokens, sampling)):
                if number == 1:  # the second iteration fails
                    raise RuntimeError("out of memory")
                yield event

    app = make_app(store_path, [BrokenEngine()])

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await say(pilot, "go")
            await wait_until(pilot, lambda: app.session.job is None and notices(app))
            assert last_notice(app).text == "decoding failed: RuntimeError: out of memory"
            assert app.query(AssistantTurn).last().cut

    run(scenario)


def test_loading_screen_shows_progress_then_the_chat(store_path):
    release = threading.Event()

    def loader(progress):
        progress("assembling model parts", 0.25)
        progress("loading layers", 0.75)
        progress("loading layers", 0.9)  # a moving bar: logged once, the bar follows
        assert release.wait(HANG_S)
        return FakeBackend()

    app = SpecchatApp(None, ConversationStore(store_path), loader=loader)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(
                pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.query_one(Log).line_count == 2
            )
            await wait_until(pilot, lambda: app.screen.query_one(ProgressBar).progress == 0.9)
            assert list(app.screen.query_one(Log).lines) == ["assembling model parts", "loading layers"]
            # on the terminal, not only in the widget tree: nothing covers them with a spinner
            shown = screen_text(app)
            assert "specchat: loading models" in shown and "assembling model parts" in shown
            await pilot.resize_terminal(90, 30)  # the chat screen below follows, though hidden
            release.set()
            await wait_until(pilot, lambda: not isinstance(app.screen, LoadingScreen))
            await ask(pilot, "hi")
            assert app.sub_title == "fake pair" and not app.panels.display

    run(scenario)


def test_a_backend_loaded_after_exit_is_closed(store_path):
    release, loaded = threading.Event(), []

    def loader(progress):
        progress("loading layers", None)
        assert release.wait(HANG_S)
        loaded.append(FakeBackend())
        return loaded[0]

    app = SpecchatApp(None, ConversationStore(store_path), loader=loader)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen))
            await pilot.press("ctrl+c", "ctrl+c")
            await wait_until(pilot, lambda: not app.is_running)
        release.set()  # asyncio.run then waits for the loader's thread

    run(scenario)
    assert loaded[0].closes == 1


def test_quitting_while_loading_stops_the_load(store_path):
    """asyncio.run waits for the loader's thread at exit: a load that went on would hold the quit
    to its end (here HANG_S). It stops at its next report instead, its cleanup run."""
    outcome, reports = [], int(HANG_S / 0.01)

    def loader(progress):
        try:
            for done in range(reports):
                progress("loading layers", done / reports)
                sleep(0.01)
        except LoadCancelled:
            outcome.append("cancelled")
            raise
        outcome.append("loaded")
        return FakeBackend()

    app = SpecchatApp(None, ConversationStore(store_path), loader=loader)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen)
                             and app.screen.query_one(ProgressBar).progress > 0)
            await pilot.press("ctrl+c", "ctrl+c")
            await wait_until(pilot, lambda: not app.is_running)

    run(scenario)  # returns once the loader's thread has ended
    assert outcome == ["cancelled"]


def test_loading_failure_is_shown_not_swallowed(store_path):
    def loader(progress):
        raise SpecchatError("no model named 'qwen9'")

    app = SpecchatApp(None, ConversationStore(store_path), loader=loader)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.has_class("-failed"))
            error = str(app.screen.query_one("#error", Static).content)
            assert "Loading failed: no model named 'qwen9'" in error

    run(scenario)


def test_the_app_needs_a_backend_or_a_loader(store_path):
    with pytest.raises(ValueError):
        SpecchatApp(None, ConversationStore(store_path))


def test_view_follows_new_text_only_while_at_the_bottom(store_path):
    app = make_app(store_path, [FakeEngine(reply=REPLY * 6, accepted=(20,))])

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            view = app.view
            await ask(pilot, "one")
            await pilot.pause()
            assert view.max_scroll_y > 0 and view.scroll_y == view.max_scroll_y
            view.scroll_home(animate=False, immediate=True)
            await ask(pilot, "two")
            await pilot.pause()
            assert view.scroll_y == 0  # reading older text: left where it was
            view.scroll_end(animate=False, immediate=True)
            await ask(pilot, "three")
            await pilot.pause()
            assert view.scroll_y == view.max_scroll_y

    run(scenario)


def panel_text(app, widget_id: str) -> str:
    return str(app.query_one(widget_id, Static).content)


def test_dsi_panels_show_the_jobs_of_the_last_event_and_of_the_reply(store_path):
    app = make_app(store_path, [FakeDSIEngine()])

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            assert app.query_one("#jobs-section").display
            assert panel_text(app, "#settings").splitlines()[:2] == ["engine dsi", "lookahead 5 · workers 2"]
            await ask(pilot, "one")
            await ask(pilot, "two")  # totals restart with each reply
            events = app.session.reply_events
            # 33 events of 2 jobs; the 5 whose chunk is a full job had no rejected draft
            assert len(events) == 33
            assert (sum(e.jobs_submitted for e in events), sum(e.jobs_preempted for e in events)) == (66, 28)
            last = events[-1]
            assert (last.jobs_submitted, last.jobs_preempted, last.jobs_in_flight) == (2, 1, 0)
            assert panel_text(app, "#jobs") == "sent 2 · preempted 1 · in flight 0\nreply: sent 66 · preempted 28"

    run(scenario)


def test_an_engine_notice_is_shown_once_above_its_reply(store_path):
    app = make_app(store_path, [FakeDSIEngine()])

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await ask(pilot, "one")
            await ask(pilot, "two")
            shown = [notice for notice in notices(app) if notice.text == WORKER_NOTICE]
            assert len(shown) == 1 and not shown[0].has_class("error")
            turns = list(app.view.children)
            assert turns.index(shown[0]) == turns.index(app.query(AssistantTurn).first()) - 1
            # Textual keeps no public list of toasts.
            toasts = [(n.message, n.severity) for n in app._notifications]
            assert toasts == [(WORKER_NOTICE, "warning")]

    run(scenario)


def test_an_engine_notice_survives_a_cut_reply(store_path):
    class LateNotice(FakeDSIEngine):
        """Says its notice on its second event, made after Esc has cut the reply."""

        events = 0

        def take_notice(self) -> str:
            self.events += 1
            return WORKER_NOTICE if self.events == 2 else ""

    gate = Gate()
    app = make_app(store_path, [LateNotice(gate=gate)])

    async def scenario():
        async with held(app, gate) as pilot:
            await say(pilot, "go")
            gate.allow(1)
            await wait_until(pilot, lambda: app.session.reply_events)
            await pilot.press("escape")
            assert not notices(app)  # the second event, with the notice, is not made yet
            gate.open()
            await wait_until(pilot, lambda: any(n.text == WORKER_NOTICE for n in notices(app)))
            assert gate.passed == 2  # the notice came with the iteration that was in progress
            assert len(app.session.reply_events) == 1 and app.query(AssistantTurn).last().cut

    run(scenario)


def test_lookahead_command_on_dsi(store_path):
    gate = Gate()
    engine = FakeDSIEngine(reply=REPLY[:60], gate=gate)
    app = make_app(store_path, [engine])

    async def scenario():
        async with held(app, gate) as pilot:
            await say(pilot, "/lookahead 65")
            assert last_notice(app).text == "lookahead must be between 1 and 64 (got 65)"
            assert last_notice(app).has_class("error") and engine.lookahead == 5 and app.session.settings.lookahead == 5
            await say(pilot, "/lookahead 8")
            assert last_notice(app).text == "lookahead set to 8" and engine.lookahead == 8
            assert "lookahead 8 · workers 2" in panel_text(app, "#settings")
            await say(pilot, "go")
            gate.allow(1)
            await wait_until(pilot, lambda: len(app.session.reply_events) == 1)
            await say(pilot, "/lookahead 3")  # while the engine is held before its second job
            assert last_notice(app).text == "lookahead set to 3 from the next job"
            gate.open()
            await wait_until(pilot, lambda: replying_done(app))
            sizes = [e.tree_size for e in app.session.reply_events]
            assert len(sizes) > 2 and sizes == [8] + [3] * (len(sizes) - 1)
            assert panel_text(app, "#tree").startswith("size 3")

    run(scenario)


def test_lookahead_command_does_not_apply_to_other_engines(store_path):
    app = make_app(store_path)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await say(pilot, "/lookahead 8")
            assert last_notice(app).text == "/lookahead applies to the dsi engine only, not specexec"
            assert last_notice(app).has_class("error") and app.session.settings.lookahead == 5
            assert "budget 16 · depth 24" in panel_text(app, "#settings")
            await say(pilot, "/budget 40")  # tree engines keep their own commands
            assert app.backend.engine.budget == 40 and not last_notice(app).has_class("error")

    run(scenario)
