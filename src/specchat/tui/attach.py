"""/file PATH: a text file put into the message being written, as a fenced code block under its
name, so that a question about code (explain it, change it) carries the code itself. The block
goes into the prompt, where it can be read and edited before it is sent: nothing is sent, kept or
attached out of sight, and the stored conversation holds exactly what the model read."""

import os
from dataclasses import dataclass
from pathlib import Path

from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

from specchat.errors import SpecchatError
from specchat.paths import expanded
from specchat.schema_file import read_user_file, shown

MAX_BYTES = 1 << 20  # a larger file outgrows any context the embedded pair runs, and the prompt's redraws
MAX_CANDIDATES = 64  # Tab's hint line shows names, not a directory of thousands


@dataclass(frozen=True)
class Attach:
    text: str  # the fenced block, its name above it
    name: str  # the file as the user named it
    lines: int


def attached_file(path: Path) -> Attach:
    """The file at `path` as a fenced block; SpecchatError (one line) where it cannot be read as
    text or is too large to chat about."""
    where = expanded(path, "/file")
    if where.is_dir():
        raise SpecchatError(f"/file {shown(path)}: a directory, not a file")
    if where.is_file() and where.stat().st_size > MAX_BYTES:
        raise SpecchatError(f"/file {shown(path)}: larger than {MAX_BYTES >> 20} MB, too large to attach")
    content = read_user_file(path, "/file")
    body = content if content.endswith("\n") or not content else content + "\n"
    fence = "`" * max(3, longest_backtick_run(content) + 1)  # CommonMark: a longer fence than any inside
    return Attach(f"`{path}`:\n{fence}{language(path)}\n{body}{fence}\n", str(path), body.count("\n"))


def language(path: Path) -> str:
    """The fence's info string: Pygments' name for the file's language, as markdown renderers
    (rich's, GitHub's) read it; empty where its name says none."""
    try:
        return get_lexer_for_filename(path.name).aliases[0]
    except (ClassNotFound, IndexError):
        return ""


def longest_backtick_run(text: str) -> int:
    longest = run = 0
    for character in text:
        run = run + 1 if character == "`" else 0
        longest = max(longest, run)
    return longest


def path_candidates(typed: str) -> list[str]:
    """Paths completing `typed` (Tab after /file): the entries of its folder that start with its
    last part, folders ending in '/', hidden ones only when that part starts with '.'."""
    folder, _, start = typed.rpartition("/")
    rooted = typed.startswith("/")
    where = Path(os.path.expanduser(folder)) if folder else Path("/" if rooted else ".")
    prefix = f"{folder}/" if folder or rooted else ""
    try:
        entries = sorted(os.scandir(where), key=lambda entry: entry.name)
    except OSError:
        return []
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries
             if entry.name.startswith(start) and (start.startswith(".") or not entry.name.startswith("."))]
    return [prefix + name for name in names[:MAX_CANDIDATES]]
