"""The session behind the app, without Pilot: a real history store under tmp_path and the fake
backend. Replies, context fitting, every slash command that changes the session, and closing."""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from time import sleep

import pytest

import specchat
from specchat.tui import commands
from specchat.tui.fake import AUTO_SIZE, REPLY, FakeBackend, FakeDSIEngine, FakeEngine
from specchat.tui.reply import ReplyJob
from specchat.tui.session import BUSY, Note, Outcome, Session
from specchat.tui.store import ConversationStore
from specchat.tui.transcript import Entry


@pytest.fixture
def store(tmp_path) -> ConversationStore:
    return ConversationStore(tmp_path / "history.sqlite3")


def session_on(store: ConversationStore, engines=None, **backend_options) -> Session:
    return Session(FakeBackend(engines, **backend_options), store)


def write_reply(session: Session, job: ReplyJob) -> None:
    """Decode `job` to the end in this thread, as the app's worker and message handlers do."""
    for event in job.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling):
        session.record(event, job.stream.push(event.token_ids))
    session.end_reply(cut=False, tail=job.stream.finish())


def ask(session: Session, text: str) -> Outcome:
    outcome = session.send(text)
    write_reply(session, outcome.job)
    return outcome


def stored(session: Session) -> list[tuple[str, str, bool]]:
    return [(m.role, m.content, m.cut) for m in session.store.messages(session.conversation_id)]


def test_session_imports_no_textual():
    code = "import sys, specchat.tui.session; print(sorted(m for m in sys.modules if m.startswith('textual')))"
    env = {**os.environ, "PYTHONPATH": str(Path(specchat.__file__).parents[1])}  # this copy of the package
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert ran.stdout == "[]\n"


def test_send_stores_the_message_and_hands_out_the_reply_to_decode(store):
    session = session_on(store)
    outcome = session.send("hello")
    job = outcome.job
    assert outcome.notes == () and session.job is job
    assert not (outcome.redraw or outcome.reply_removed or outcome.system_prompt)  # the app draws only the reply
    assert job.prompt_ids == session.backend.encode([{"role": "user", "content": "hello"}])
    assert (job.engine, job.max_new_tokens, job.sampling.seed) == (session.backend.engine, 1024, 0)
    assert store.conversation(session.conversation_id).title == "hello"
    write_reply(session, job)
    assert session.job is None and job.cancel.is_set()
    assert stored(session) == [("user", "hello", False), ("assistant", REPLY, False)]
    assert [entry.role for entry in session.entries] == ["user", "assistant"]
    assert session.last_summary.new_tokens == len(REPLY) == sum(len(e.token_ids) for e in session.reply_events)
    assert session.send("again").job.id == job.id + 1


def test_a_cut_reply_keeps_what_was_written(store):
    session = session_on(store)
    job = session.send("tell me").job
    event = next(job.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling))
    session.record(event, job.stream.push(event.token_ids))
    assert session.is_current(job.id) and not session.is_current(job.id + 1)
    session.end_reply(cut=True)
    assert not session.is_current(job.id)
    assert stored(session)[-1] == ("assistant", REPLY[:4], True)
    assert session.entries[-1] == Entry("assistant", REPLY[:4], True, session.entries[-1].message_id)


def test_oldest_turns_leave_the_context_with_one_notice(store):
    # 300 tokens of context, 100 kept for the reply: three exchanges do not fit.
    session = session_on(store, context=300)
    session.execute(commands.SetSetting("max_tokens", 100))
    session.execute(commands.SetSetting("system_prompt", "S"))
    assert [ask(session, question).notes for question in ["q1", "q2"]] == [(), ()]
    outcome = ask(session, "q3")
    assert outcome.notes == (Note("context full: the oldest 2 messages are left out (system prompt kept)"),)
    assert session.backend.tokenizer.decode(outcome.job.prompt_ids).startswith("<system>S<user>q2")
    retried = session.retry()
    assert retried.notes == () and retried.job.prompt_ids == outcome.job.prompt_ids  # said once, until more go
    write_reply(session, retried.job)
    assert ask(session, "q4").notes == (Note("context full: the oldest 4 messages are left out (system prompt kept)"),)
    overflow = session.send("x" * 500)
    assert overflow.job is None and session.job is None
    prompt = len("<system>S<user>") + 500 + len("<assistant>")  # all the older turns dropped; a token a character
    assert overflow.notes == (Note(f"the prompt is {prompt} tokens, which leaves no room for a reply in the 300-token "
                                   "context: shorten it", error=True),)


def test_a_first_message_too_long_for_the_context_is_left_out_of_the_next_prompt_with_a_notice(store):
    session = session_on(store, context=300)
    assert session.send("x" * 400).notes[0].error
    outcome = session.send("q1")
    assert outcome.notes == (Note("context full: the oldest 1 messages are left out (system prompt kept)"),)
    assert session.backend.tokenizer.decode(outcome.job.prompt_ids) == "<user>q1<assistant>"


def test_each_prompt_extends_the_last_one_until_turns_are_dropped(store):
    """What lets the engine reuse its caches: a new turn's prompt starts with the previous
    prompt and reply, /retry sends the same prompt, and after a drop (one notice) the prompts
    extend the shortened one again."""
    session = session_on(store, context=600)
    session.execute(commands.SetSetting("max_tokens", 100))
    prompts, notes = [], []
    for question in ["q1", "q2", "q3", "q4", "q5", "q6", "q7"]:
        outcome = ask(session, question)
        prompts.append(outcome.job.prompt_ids)
        notes.append(outcome.notes)
    decode = session.backend.tokenizer.decode
    dropped_at = [i for i, note in enumerate(notes) if note]
    assert dropped_at == [5]  # the sixth outgrows 500 tokens: one drop, once
    for earlier, later in zip(prompts, prompts[1:]):
        if later is not prompts[5]:
            assert decode(later).startswith(decode(earlier)[:-len("<assistant>")])
    assert "q1" not in decode(prompts[5]) and "q2" not in decode(prompts[5]) and "q4" in decode(prompts[5])
    assert session.retry().job.prompt_ids == prompts[-1]


def test_clear_load_and_switching_engines_drop_the_kept_caches(store):
    session = session_on(store)
    first, second = session.backend.engines.values()
    ask(session, "hello")
    session.execute(commands.Clear())
    assert first.forgets == 1
    session.change("engine", second.name)
    assert (first.forgets, second.forgets) == (2, 0)
    session.execute(commands.Load(1))
    assert second.forgets == 1


def test_setting_changes_reach_the_engine_live_and_say_when(store):
    session = session_on(store)
    engine = session.backend.engine
    assert session.change("budget", 64) == Outcome(notes=(Note("budget set to 64"),))
    assert session.change("seed", None).notes == (Note("seed set to off"),)
    assert session.change("max_tokens", 100).notes == (Note("max-tokens set to 100"),)  # as the command is typed
    job = session.send("go").job
    assert session.change("depth", 8).notes == (Note("depth set to 8 from the next iteration"),)
    assert session.change("temperature", 0.2).notes == (Note("temperature set to 0.2 from the next reply"),)
    assert (engine.budget, engine.max_depth, job.sampling.temperature) == (64, 8, 0.6)
    assert (session.settings.budget, session.settings.depth, session.settings.seed) == (64, 8, None)


def test_budget_auto_is_taken_by_an_engine_that_sizes_its_trees(store):
    session = session_on(store)
    assert session.change("budget", "auto").notes == (Note("budget set to auto"),)
    assert session.backend.engine.budget == "auto" and session.settings.budget == "auto"
    outcome = session.send("go")
    sizes = {event.tree_size for event in outcome.job.engine.generate(outcome.job.prompt_ids, 8, outcome.job.sampling)}
    assert sizes == {AUTO_SIZE}
    assert session.change("budget", 24).notes == (Note("budget set to 24 from the next iteration"),)
    assert session.backend.engine.budget == 24


def test_budget_auto_is_refused_where_the_engine_keeps_its_size(store):
    session = session_on(store, [FakeEngine(sizes_trees=False), FakeEngine(name="autoregressive")])
    refused = session.change("budget", "auto")
    assert refused.notes == (Note("/budget auto is not available for specexec in this run: only specexec sizes "
                                  "its own trees, when `specchat run` starts with --budget auto", error=True),)
    assert session.backend.engine.budget == 16 and session.settings.budget == 16


def test_a_budget_past_the_planned_tree_is_refused_and_the_engine_keeps_its_size(store):
    session = session_on(store)
    session.backend.max_budget = 1024  # what a plan made room for
    assert session.change("budget", 1024).notes == (Note("budget set to 1024"),)
    refused = session.change("budget", 1025)
    assert refused.notes == (Note("/budget 1025 is past the 1024-token tree this run's memory plan made room for: "
                                  "restart with --budget 1025 to plan for it", error=True),)
    assert session.backend.engine.budget == 1024 and session.settings.budget == 1024


def test_switching_engines_shows_the_size_the_new_engine_keeps(store):
    session = session_on(store, [FakeEngine(), FakeEngine(name="sd", sizes_trees=False, budget=12)])
    session.change("budget", "auto")
    session.change("engine", "sd")
    assert session.settings.budget == 12 and session.backend.engine.budget == 12


def test_lookahead_is_for_dsi_only(store):
    session = session_on(store)
    refused = session.change("lookahead", 8)
    assert refused.notes == (Note("/lookahead applies to the dsi engine only, not specexec", error=True),)
    assert session.settings.lookahead == 5
    dsi = session_on(store, [FakeDSIEngine()])
    assert dsi.workers == 2 and session.workers == 0
    dsi.send("go")
    assert dsi.change("lookahead", 3).notes == (Note("lookahead set to 3 from the next job"),)
    assert dsi.backend.engine.lookahead == 3


def test_switching_engines_carries_the_settings_over(store):
    session = session_on(store)
    session.change("budget", 40)
    assert session.change("engine", "warp").notes == (
        Note("unknown engine 'warp': choose one of specexec, autoregressive", error=True),
    )
    assert session.backend.engine.name == "specexec"
    assert session.execute(commands.SetSetting("engine", "autoregressive")).notes == (
        Note("engine set to autoregressive"),
    )
    assert session.backend.engine.budget == 40 and session.settings.engine == "autoregressive"
    job = session.send("hi").job
    assert job.engine is session.backend.engines["autoregressive"]
    assert session.change("engine", "specexec").notes == (Note("engine set to specexec from the next reply"),)
    assert job.engine is session.backend.engines["autoregressive"]  # the reply being written keeps its engine


def test_system_prompt_is_stored_with_the_conversation(store):
    session = session_on(store)
    outcome = session.change("system_prompt", "Be brief.")
    assert outcome == Outcome(system_prompt=True, notes=(Note("system prompt set"),))
    ask(session, "hi")
    assert store.conversation(session.conversation_id).system_prompt == "Be brief."
    session.change("system_prompt", "Be terse.")
    assert store.conversation(session.conversation_id).system_prompt == "Be terse."
    assert session.send("again").job.prompt_ids[:len("<system>Be terse.")] == [ord(c) for c in "<system>Be terse."]


def test_a_reply_is_stored_as_it_is_written_so_a_crash_keeps_it_as_cut(store):
    session = session_on(store)
    job = session.send("question").job
    events = job.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling)
    for event in [next(events), next(events)]:
        session.record(event, job.stream.push(event.token_ids))
    written = session.reply_text
    assert written and stored(session) == [("user", "question", False), ("assistant", written, True)]
    # What a restart finds after a kill -9 here: the text so far, marked cut.
    reopened = ConversationStore(store.path)
    assert [(m.role, m.content, m.cut) for m in reopened.messages(session.conversation_id)] == \
        [("user", "question", False), ("assistant", written, True)]


def test_retry_deletes_the_last_reply_and_writes_it_again(store):
    session = session_on(store)
    assert session.retry().notes == (Note("nothing to retry yet", error=True),)
    ask(session, "question")
    outcome = session.retry()
    assert outcome.reply_removed and outcome.job is session.job
    assert stored(session) == [("user", "question", False), ("assistant", "", True)]  # the new reply, so far
    write_reply(session, outcome.job)
    assert [entry.role for entry in session.entries] == ["user", "assistant"]
    assert stored(session) == [("user", "question", False), ("assistant", REPLY, False)]
    session.send("x" * 5000)  # overflows: no reply to remove
    retried = session.retry()
    assert not retried.reply_removed and retried.notes[0].error


def test_retry_writes_the_reply_a_first_message_had_no_room_for_once_it_has(store):
    session = session_on(store, context=300)
    session.change("system_prompt", "S" * 300)
    assert session.send("question").notes[0].error and [e.role for e in session.entries] == ["user"]
    session.change("system_prompt", "Be brief.")
    retried = session.retry()
    assert retried.notes == () and not retried.reply_removed
    assert session.backend.tokenizer.decode(retried.job.prompt_ids) == "<system>Be brief.<user>question<assistant>"
    assert stored(session) == [("user", "question", False), ("assistant", "", True)]


def test_clear_starts_a_new_conversation(store):
    session = session_on(store)
    ask(session, "first")
    first = session.conversation_id
    assert session.clear() == Outcome(redraw=True, notes=(Note("new conversation"),))
    assert session.entries == [] and session.conversation_id is None
    ask(session, "second")
    assert session.conversation_id != first and len(store.conversations()) == 2


def test_load_lists_and_reopens_conversations(store):
    session = session_on(store)
    assert session.list_conversations().notes == (Note("no saved conversations"),)
    session.change("system_prompt", "S")
    ask(session, "first question")
    first = session.conversation_id
    session.clear()
    session.change("system_prompt", "T")
    ask(session, "second question")
    listing = session.execute(commands.Load(None)).notes[0].text
    assert listing.splitlines() == ["saved conversations (/load ID):", f"{session.conversation_id:>5}  second question",
                                    f"{first:>5}  first question"]
    assert session.open(99).notes == (Note("no conversation 99: /load alone lists them", error=True),)
    outcome = session.execute(commands.Load(first))
    assert outcome == Outcome(redraw=True, notes=(Note(f"conversation {first}: first question"),))
    assert session.conversation_id == first and session.settings.system_prompt == "S"
    assert [(e.role, e.content) for e in session.entries] == [("user", "first question"), ("assistant", REPLY)]


def test_save_exports_markdown_or_says_why_not(store, tmp_path, monkeypatch):
    session = session_on(store)
    assert session.save(None).notes == (Note("nothing to save yet", error=True),)
    ask(session, "first question")
    target = tmp_path / "out.md"
    assert session.execute(commands.Save(str(target))).notes == (Note(f"saved to {target}"),)
    assert target.read_text().startswith("# first question\n\n## User\n\nfirst question")
    monkeypatch.chdir(tmp_path)
    named = tmp_path / f"specchat-{session.conversation_id}.md"
    assert session.save(None).notes == (Note(f"saved to {named}"),) and named.read_text() == target.read_text()
    missing = tmp_path / "missing" / "out.md"
    assert session.save(str(missing)).notes == (Note(f"cannot save to {missing}: No such file or directory",
                                                        error=True),)
    nameless = session.save("a\x00b.md").notes[0]  # a pasted name: ValueError, which crashed the app
    assert nameless.error and nameless.text == "/save 'a\\x00b.md': not a file name"
    homeless = session.save("~specchat-no-such-user/out.md").notes[0]
    assert homeless.error and homeless.text.startswith("/save ~specchat-no-such-user/out.md: no home directory")


def test_messages_and_conversation_commands_wait_for_the_reply(store):
    session = session_on(store)
    ask(session, "first")
    job = session.send("second").job
    for command in [commands.Clear(), commands.Retry(), commands.Load(None), commands.Load(1)]:
        assert session.execute(command) == Outcome(notes=(Note(BUSY, error=True),)), command
    assert session.send("third") == Outcome(notes=(Note(BUSY, error=True),))
    assert BUSY == "a reply is being written: press Esc to stop it first"  # the way out, said where it is refused
    assert session.job is job and session.conversation_id == 1 and len(session.entries) == 3


def test_stats_help_and_quit_are_the_apps(store):
    with pytest.raises(ValueError, match="not a session command"):
        session_on(store).execute(commands.Quit())


def test_close_keeps_the_reply_as_cut_and_closes_the_backend_once_the_engine_is_idle(store, monkeypatch):
    session = session_on(store, [FakeEngine()])
    job = session.send("tell me").job
    order, iterating = [], threading.Event()

    def iteration() -> None:  # the cut reply's iteration in progress, in the decoding thread
        with session.engine_lock:
            iterating.set()
            sleep(0.1)
            order.append("iteration ended")

    decoding = threading.Thread(target=iteration)
    decoding.start()
    assert iterating.wait(5)
    close = session.backend.close
    monkeypatch.setattr(session.backend, "close", lambda: (order.append("backend closed"), close()))
    session.close()
    decoding.join()
    assert order == ["iteration ended", "backend closed"] and session.backend.closes == 1
    assert session.job is None and job.cancel.is_set()
    assert stored(session)[-1] == ("assistant", "", True)


def test_json_and_schema_give_the_next_replies_a_guide_and_off_takes_it_away(store, tmp_path):
    session = session_on(store)
    said = session.execute(commands.parse("/json on"))
    assert said.notes[0].text == "replies: JSON objects" and not said.notes[0].error
    outcome = session.send("hi")
    assert outcome.job.sampling.guide.form == {"type": "object"}
    write_reply(session, outcome.job)
    schema = tmp_path / "person.json"
    schema.write_text('{"type": "object", "properties": {"name": {"type": "string"}}}')
    assert session.execute(commands.parse(f"/schema {schema}")).notes[0].text == "replies: JSON valid under the schema"
    outcome = session.send("again")
    assert outcome.job.sampling.guide.form["properties"] == {"name": {"type": "string"}}
    write_reply(session, outcome.job)
    assert session.execute(commands.parse("/json off")).notes[0].text == "replies: free text"
    assert session.send("free").job.sampling.guide is None


def test_grammar_gives_the_next_replies_its_language_in_place_of_a_schema(store, tmp_path):
    session = session_on(store)
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    session.execute(commands.parse("/json on"))
    said = session.execute(commands.parse(f"/grammar {grammar}"))
    assert said.notes[0].text == "replies: in the grammar's language" and not said.notes[0].error
    outcome = session.send("well?")
    assert outcome.job.sampling.guide.form == 'root ::= "yes" | "no"\n'  # the grammar, no longer the schema
    write_reply(session, outcome.job)
    assert session.execute(commands.parse("/grammar off")).notes[0].text == "replies: free text"
    refused = session.execute(commands.SetSetting("reply_form", "root ::= uncompilable\n"))
    assert refused.notes[0].error and refused.notes[0].text == "the grammar cannot be compiled: uncompilable"
    assert session.settings.reply_form is None
    with pytest.raises(commands.CommandError, match="/grammar /nowhere.gbnf: No such file or directory"):
        commands.parse("/grammar /nowhere.gbnf")


def test_a_schema_the_grammar_engine_refuses_is_one_line_and_changes_nothing(store, tmp_path):
    session = session_on(store)
    refused = session.execute(commands.SetSetting("reply_form", {"uncompilable": True}))
    assert refused.notes[0].error and refused.notes[0].text == "the JSON schema cannot be compiled: uncompilable"
    assert session.settings.reply_form is None
    for text, message in (("/schema /nowhere.json", "/schema /nowhere.json: No such file or directory"),
                          ("/json maybe", "/json takes on or off (got 'maybe')")):
        with pytest.raises(commands.CommandError, match=re.escape(message)):
            commands.parse(text)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(commands.CommandError, match="a JSON schema is an object"):
        commands.parse(f"/schema {bad}")


def test_a_reply_to_quoted_code_has_that_code_as_its_prediction_and_a_retry_a_fresh_one(store):
    """The code the user's message quotes reaches the engine as the reply's predicted output (SpecExec
    scores it as a chain once the reply reaches it); a message without code sends none."""
    session = session_on(store)
    plain = session.send("What is a mutex?").job
    assert plain.sampling.prediction is None
    write_reply(session, plain)
    quoted = session.send("Rename x:\n\n```python\nx = 1\n```").job
    code = tuple(ord(char) for char in "```python\nx = 1\n```")  # the fake tokenizer: a token a character
    assert quoted.sampling.prediction.tokens == code and quoted.sampling.prediction.chain(1) == ()
    write_reply(session, quoted)
    retried = session.execute(commands.Retry()).job
    assert retried.sampling.prediction.tokens == code and retried.sampling.prediction is not quoted.sampling.prediction
