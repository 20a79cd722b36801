"""Conversations kept in SQLite under the platformdirs data dir; every write is one transaction,
in WAL mode, so a crash mid-write leaves every committed message readable. An unreadable file is
moved aside, never deleted, and a new one is started."""

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from time import time

from platformdirs import user_data_dir

from specchat.errors import SpecchatError

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    cut INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
"""


def default_path() -> Path:
    """The history file; SPECCHAT_DATA_DIR overrides the platform data dir (tests, scripts)."""
    override = os.environ.get("SPECCHAT_DATA_DIR")
    return Path(override or user_data_dir("specchat")) / "history.sqlite3"


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str
    content: str
    cut: bool


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    updated_at: float


class StoreError(SpecchatError):
    """The history file exists but was written by an unknown version of specchat."""


class Unreadable(SpecchatError):
    """SQLite could not read the history file, which is now at `backup` with its log and map."""

    def __init__(self, backup: Path, error: sqlite3.DatabaseError) -> None:
        super().__init__(f"the history file could not be read ({error}): it was moved to {backup}")


class ConversationStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.notice: str | None = None  # one line for the user when the file had to be moved aside
        try:
            self.open()
        except Unreadable as moved:
            self.notice = f"{moved}; a new one is used"
            self.open()

    def open(self) -> None:
        """Connect and migrate. A file SQLite cannot read is moved aside before its connection closes:
        closing deletes the write-ahead log and shared memory SQLite found beside the file, and the
        log may hold the last messages written."""
        try:  # autocommit mode, so that `transaction` alone decides where each write begins and ends
            self.db = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.DatabaseError as error:  # nothing SQLite can open (a folder in the file's place)
            raise Unreadable(self.move_aside(), error) from None
        try:
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            self.migrate()
        except sqlite3.DatabaseError as error:
            backup = self.move_aside()
            self.db.close()
            raise Unreadable(backup, error) from None
        except BaseException:
            self.db.close()
            raise

    def move_aside(self) -> Path:
        """Rename the history file (and its WAL files) to history.sqlite3.corrupt-TIME."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        backup = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            sidecar = self.path.with_name(self.path.name + suffix)
            if sidecar.exists():
                sidecar.rename(backup.with_name(backup.name + suffix))
        return backup

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def migrate(self) -> None:
        with self.transaction() as db:
            exists = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_version'").fetchone()
            if not exists:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
                return
            (version,) = db.execute("SELECT version FROM schema_version").fetchone()
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}; this specchat reads {SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    def new_conversation(self, title: str, system_prompt: str) -> int:
        now = time()
        with self.transaction() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (title, system_prompt, now, now),
            )
        return cursor.lastrowid

    def add_message(self, conversation_id: int, role: str, content: str, cut: bool = False) -> int:
        now = time()
        with self.transaction() as db:
            cursor = db.execute(
                "INSERT INTO messages (conversation_id, role, content, cut, created_at) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, int(cut), now),
            )
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        return cursor.lastrowid

    def update_message(self, message_id: int, content: str, cut: bool) -> None:
        with self.transaction() as db:
            db.execute("UPDATE messages SET content = ?, cut = ? WHERE id = ?", (content, int(cut), message_id))

    def delete_message(self, message_id: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute(
            "SELECT id, title, system_prompt, updated_at FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return Conversation(*row) if row else None

    def conversations(self, limit: int = 20) -> list[Conversation]:
        """The most recently updated first."""
        rows = self.db.execute(
            "SELECT id, title, system_prompt, updated_at FROM conversations ORDER BY updated_at DESC, id DESC LIMIT ?",
            (limit,),
        )
        return [Conversation(*row) for row in rows]

    def last_conversation_id(self) -> int | None:
        latest = self.conversations(limit=1)
        return latest[0].id if latest else None

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute(
            "SELECT id, role, content, cut FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return [StoredMessage(id, role, content, bool(cut)) for id, role, content, cut in rows]

    def recent_inputs(self, limit: int = 200) -> list[str]:
        """What the user typed, across conversations, oldest first (for Up/Down recall)."""
        rows = self.db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (limit,))
        return [content for (content,) in rows][::-1]
