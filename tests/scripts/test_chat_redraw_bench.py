"""scripts/bench_chat_redraw.py: when the chat's reply has ended (its store), and its /stats figures (the screen)."""

import sqlite3

from helpers.scripts import load_script

bench = load_script("bench_chat_redraw")
reply_figures = bench.reply_figures

# /stats as the chat drew it beside the panels (a 120 x 50 terminal), its lines cut by the panels' bar
SCREEN = """  last reply: 210 tokens in 60 iterations (3.50 per iteration), 4.5 tokens/s;     ▏
  draft 14.55 s, target 32.45 s, transfer 0.00 s; prefill 41 tokens in 4.74 s     ▏
  session: 60 iterations, mean accepted 2.50 over the last 60                     ▏"""


def test_the_last_replys_figures_are_read_off_the_screen():
    assert reply_figures(SCREEN) == {"new_tokens": 210, "iterations": 60, "tokens_per_s": 4.5, "draft_s": 14.55,
                                     "target_s": 32.45}


def test_a_screen_without_them_gives_none():
    assert reply_figures("  Message, or /help") is None


def test_a_reply_has_ended_once_its_store_unmarks_it(tmp_path):
    """As the chat stores a reply: marked cut from its start, unmarked when it ends."""
    history = tmp_path / "history.sqlite3"
    assert not bench.reply_ended(history)  # the chat has not made its store yet
    with sqlite3.connect(history) as store:
        store.execute("CREATE TABLE messages (role TEXT, content TEXT, cut INTEGER)")
        store.execute("INSERT INTO messages VALUES ('user', 'hi', 0), ('assistant', 'Hel', 1)")
    assert not bench.reply_ended(history)
    with sqlite3.connect(history) as store:
        store.execute("UPDATE messages SET content = 'Hello', cut = 0 WHERE role = 'assistant'")
    assert bench.reply_ended(history)
