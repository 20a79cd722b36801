"""The SQLite conversation store and the markdown export."""

import re
import sqlite3
import sys

import pytest

from specchat.tui.export import to_markdown
from specchat.tui.store import Conversation, ConversationStore, StoreError, default_path


@pytest.fixture
def path(tmp_path):
    return tmp_path / "data" / "history.sqlite3"


def test_messages_survive_reopening(path):
    store = ConversationStore(path)
    first = store.new_conversation("greeting", "Be brief.")
    store.add_message(first, "user", "hi")
    store.add_message(first, "assistant", "hel", cut=True)
    store.close()

    reopened = ConversationStore(path)
    assert reopened.last_conversation_id() == first
    assert [(m.role, m.content, m.cut) for m in reopened.messages(first)] == [
        ("user", "hi", False), ("assistant", "hel", True)
    ]
    assert reopened.conversation(first).system_prompt == "Be brief."


def test_last_conversation_is_the_most_recently_updated(path):
    store = ConversationStore(path)
    old = store.new_conversation("old", "")
    new = store.new_conversation("new", "")
    store.add_message(old, "user", "back to this one")
    assert store.last_conversation_id() == old
    assert [c.id for c in store.conversations()] == [old, new]
    assert store.conversation(999) is None


def test_recent_inputs_are_user_messages_oldest_first(path):
    store = ConversationStore(path)
    conversation = store.new_conversation("t", "")
    for role, text in [("user", "a"), ("assistant", "x"), ("user", "b")]:
        store.add_message(conversation, role, text)
    assert store.recent_inputs() == ["a", "b"]


def test_the_recall_holds_the_last_two_hundred_inputs(path):
    store = ConversationStore(path)
    conversation = store.new_conversation("t", "")
    for number in range(201):
        store.add_message(conversation, "user", str(number))
    assert store.recent_inputs() == [str(number) for number in range(1, 201)]


def test_failed_write_leaves_nothing_behind(path):
    store = ConversationStore(path)
    conversation = store.new_conversation("t", "")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(conversation, "narrator", "not a role")
    assert store.messages(conversation) == []
    store.add_message(conversation, "user", "still writable")
    assert len(store.messages(conversation)) == 1


def test_unknown_schema_version_is_refused(path):
    ConversationStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreError) as refused:
        ConversationStore(path)
    assert str(refused.value) == f"{path} has schema version 99; this specchat reads 1"


FIRST_RELEASE_FILE = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (1);
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL,
                            created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL, role TEXT NOT NULL,
                       content TEXT NOT NULL, cut INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL);
INSERT INTO conversations VALUES (4, 'kept', 'Be brief.', 10.0, 20.0);
INSERT INTO messages VALUES (1, 4, 'user', 'hi', 0, 11.0), (2, 4, 'assistant', 'hel', 1, 12.0);
"""


def test_a_history_file_as_the_first_release_wrote_it_is_read_whole(path):
    """Version 1's tables, written here by plain SQL: an upgrade of specchat loses none of them."""
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.executescript(FIRST_RELEASE_FILE)
    db.close()
    store = ConversationStore(path)
    assert store.notice is None and store.last_conversation_id() == 4
    assert store.conversation(4) == Conversation(4, "kept", "Be brief.", 20.0)
    assert [(m.id, m.role, m.content, m.cut) for m in store.messages(4)] == [
        (1, "user", "hi", False), (2, "assistant", "hel", True)]


def test_delete_and_system_prompt_updates(path):
    store = ConversationStore(path)
    conversation = store.new_conversation("t", "")
    message = store.add_message(conversation, "user", "q")
    store.delete_message(message)
    store.set_system_prompt(conversation, "New rules.")
    assert store.messages(conversation) == []
    assert store.conversation(conversation).system_prompt == "New rules."


def test_data_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path))
    assert default_path() == tmp_path / "history.sqlite3"


@pytest.mark.skipif(sys.platform != "linux", reason="XDG_DATA_HOME places the data folder on Linux only")
def test_the_history_lives_in_the_platforms_data_folder_under_specchat(monkeypatch, tmp_path):
    """Where every release looked for it ($XDG_DATA_HOME/specchat on Linux): moving it would hide
    the user's conversations."""
    monkeypatch.delenv("SPECCHAT_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_path() == tmp_path / "specchat" / "history.sqlite3"


def test_the_list_of_conversations_holds_the_last_twenty_updated(path):
    store = ConversationStore(path)
    ids = [store.new_conversation(str(number), "") for number in range(21)]
    assert [conversation.id for conversation in store.conversations()] == ids[:0:-1]


def test_markdown_export(path):
    store = ConversationStore(path)
    conversation = store.new_conversation("Sorting", "Answer in Python.")
    store.add_message(conversation, "user", "sort a list")
    store.add_message(conversation, "assistant", "`sorted(xs)`", cut=True)
    text = to_markdown(store.conversation(conversation), store.messages(conversation))
    assert text == (
        "# Sorting\n\n## System\n\nAnswer in Python.\n\n## User\n\nsort a list\n\n"
        "## Assistant\n\n`sorted(xs)`\n\n*(reply cut)*\n"
    )


def test_an_unreadable_file_is_moved_aside_and_a_new_one_started(path):
    """Its write-ahead log goes beside it, under the same stamp and as it was (it may hold the last
    messages written), and the log's index too (SQLite's shared memory, which it rewrites on opening)."""
    path.parent.mkdir(parents=True)
    garbage, log = b"not a database " * 400, b"a log"
    path.write_bytes(garbage)
    path.with_name(path.name + "-wal").write_bytes(log)
    path.with_name(path.name + "-shm").write_bytes(b"a map")
    store = ConversationStore(path)
    backups = list(path.parent.glob("history.sqlite3.corrupt-*[0-9]"))
    assert len(backups) == 1 and backups[0].read_bytes() == garbage  # kept as it was
    assert re.fullmatch(r"history\.sqlite3\.corrupt-\d{8}-\d{6}", backups[0].name)  # when: sorts by time
    assert backups[0].with_name(backups[0].name + "-wal").read_bytes() == log
    assert backups[0].with_name(backups[0].name + "-shm").is_file()
    assert store.notice == (f"the history file could not be read (file is not a database): it was moved to "
                            f"{backups[0]}; a new one is used")
    conversation = store.new_conversation("after", "")
    store.add_message(conversation, "user", "hello again")
    store.close()
    reopened = ConversationStore(path)
    assert reopened.notice is None and [m.content for m in reopened.messages(conversation)] == ["hello again"]


def test_the_history_is_written_ahead(path):
    store = ConversationStore(path)
    assert store.db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_closing_the_store_folds_the_write_ahead_log_into_the_file(path):
    """The last connection's close checkpoints the log and removes it: the history is one file again,
    which a copy or a backup of the data folder takes whole."""
    store = ConversationStore(path)
    store.add_message(store.new_conversation("t", ""), "user", "hi")
    assert path.with_name(path.name + "-wal").exists()
    store.close()
    assert not path.with_name(path.name + "-wal").exists()


def test_the_data_folder_is_made_with_the_folders_above_it(tmp_path):
    """A fresh machine may lack the platform's data folder itself (~/.local/share), not only ours."""
    path = tmp_path / "share" / "specchat" / "history.sqlite3"
    store = ConversationStore(path)
    store.add_message(store.new_conversation("t", ""), "user", "hi")
    assert path.is_file()


def test_a_message_for_no_conversation_is_refused_and_nothing_is_written(path):
    store = ConversationStore(path)
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(999, "user", "orphan")
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)


def test_a_folder_in_the_history_files_place_is_moved_aside_and_a_new_file_started(path):
    (path / "inside").mkdir(parents=True)
    store = ConversationStore(path)
    [backup] = path.parent.glob("history.sqlite3.corrupt-*")
    assert (backup / "inside").is_dir() and store.notice == (
        f"the history file could not be read (unable to open database file): it was moved to {backup}; "
        "a new one is used")
    store.add_message(store.new_conversation("t", ""), "user", "hi")
    assert path.is_file()
