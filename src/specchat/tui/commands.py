"""Slash commands: parsing into typed commands, usage lines for /help, Tab completion.

Parsing checks argument types and ranges, so an invalid command is rejected before anything
changes; only the engine name is checked later, against what the backend offers.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os.path import commonprefix
from pathlib import Path

from specchat.decoding.events import AUTO
from specchat.errors import SpecchatError
from specchat.schema_file import read_schema_file, read_user_file
from specchat.tui.attach import Attach, attached_file, path_candidates
from specchat.tui.settings import problem

ANY_OBJECT = {"type": "object"}  # /json on: any JSON object


@dataclass(frozen=True)
class SetSetting:
    field: str  # a DecodingSettings field
    value: object


@dataclass(frozen=True)
class Clear:
    pass


@dataclass(frozen=True)
class Retry:
    pass


@dataclass(frozen=True)
class Save:
    path: str | None


@dataclass(frozen=True)
class Load:
    conversation_id: int | None  # None: list recent conversations


@dataclass(frozen=True)
class Stats:
    pass


@dataclass(frozen=True)
class Help:
    pass


@dataclass(frozen=True)
class Quit:
    pass


Command = SetSetting | Clear | Retry | Save | Load | Stats | Help | Quit | Attach


class CommandError(ValueError):
    """A command that cannot run; the message is one line, shown inline."""


@dataclass(frozen=True)
class CommandSpec:
    name: str
    args: str  # as shown in usage, e.g. "N" or "[FILE]"
    summary: str
    parse: Callable[[str], Command]

    @property
    def usage(self) -> str:
        return f"/{self.name} {self.args}".rstrip()


def parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"/{name} needs a whole number (got {text!r})") from None


def parse_float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CommandError(f"/{name} needs a number (got {text!r})") from None


def checked(field: str, value: object) -> SetSetting:
    error = problem(field, value)
    if error:
        raise CommandError(error)
    return SetSetting(field, value)


def no_args(command: Command) -> Callable[[str], Command]:
    def parse(text: str) -> Command:
        if text:
            raise CommandError(f"this command takes no arguments (got {text!r})")
        return command

    return parse


def required(name: str, parse: Callable[[str], Command]) -> Callable[[str], Command]:
    def parse_present(text: str) -> Command:
        if not text:
            raise CommandError(f"usage: {COMMANDS[name].usage}")
        return parse(text)

    return parse_present


def parse_seed(text: str) -> Command:
    return checked("seed", None if text.lower() == "off" else parse_int("seed", text))


def parse_budget(text: str) -> Command:
    if text.lower() == AUTO:
        return SetSetting("budget", AUTO)
    try:
        size = int(text)
    except ValueError:
        raise CommandError(f"/budget needs a whole number or 'auto' (got {text!r})") from None
    return checked("budget", size)


def parse_load(text: str) -> Command:
    number = parse_int("load", text) if text else None
    if number is not None and not 0 <= number < 2**63:  # SQLite's integers: a larger id is none
        raise CommandError(f"/load: no conversation {number}")
    return Load(number)


def parse_json(text: str) -> Command:
    if text not in ("on", "off"):
        raise CommandError(f"/json takes on or off (got {text!r})")
    return SetSetting("reply_form", ANY_OBJECT if text == "on" else None)


def reading(read: Callable[[Path], Command]) -> Callable[[str], Command]:
    """The command made from the file named (`read`), its problem as the command's one line."""
    def parse(text: str) -> Command:
        try:
            return read(Path(text))
        except SpecchatError as error:
            raise CommandError(str(error)) from None

    return parse


def form_file(read: Callable[[Path], object]) -> Callable[[str], Command]:
    """/schema and /grammar: the reply's form from the file named; off: free text again."""
    from_file = reading(lambda path: SetSetting("reply_form", read(path)))
    return lambda text: SetSetting("reply_form", None) if text == "off" else from_file(text)


def int_setting(command: str, field: str) -> Callable[[str], Command]:
    return required(command, lambda text: checked(field, parse_int(command, text)))


def float_setting(command: str, field: str) -> Callable[[str], Command]:
    return required(command, lambda text: checked(field, parse_float(command, text)))


def text_setting(command: str, field: str) -> Callable[[str], Command]:
    return required(command, lambda text: SetSetting(field, text))


def numeric(command: str, usage: str, summary: str,
            setting: Callable[[str, str], Callable[[str], Command]] = float_setting) -> CommandSpec:
    """The command that sets the numeric setting of its own name (its dashes underscores)."""
    return CommandSpec(command, usage, summary, setting(command, command.replace("-", "_")))


SPECS = [
    CommandSpec("budget", "N|auto", "draft tree size K; auto: sized every iteration (from the next iteration)",
                required("budget", parse_budget)),
    numeric("depth", "N", "deepest draft tree node (from the next iteration)", int_setting),
    numeric("lookahead", "N", "dsi: drafts per verification job (from the next job)", int_setting),
    CommandSpec("temp", "T", "sampling temperature, 0 = greedy (from the next reply)",
                float_setting("temp", "temperature")),
    numeric("top-p", "P", "nucleus sampling mass (from the next reply)"),
    numeric("top-k", "K", "sample among the K likeliest tokens, 0 = all (from the next reply)", int_setting),
    numeric("min-p", "P", "drop tokens below P x the likeliest's probability, 0 = none (from the next reply)"),
    numeric("typical-p", "P", "keep the tokens of typical surprise up to mass P, 1 = all (from the next reply)"),
    numeric("top-n-sigma", "N", "keep the tokens within N deviations of the top logit, 0 = all (from the next reply)"),
    numeric("xtc-probability", "P", "how often XTC drops the likeliest tokens, 0 = never (from the next reply)"),
    numeric("xtc-threshold", "T", "the probability from which XTC counts a token as a top choice (from the next "
            "reply)"),
    numeric("dynatemp-range", "R", "dynamic temperature within temp +- R, set by the entropy, 0 = off (from the "
            "next reply)"),
    numeric("dynatemp-exponent", "E", "the power of the entropy that sets the dynamic temperature (from the next "
            "reply)"),
    numeric("mirostat", "N", "sample by mirostat 1 or 2 in place of the cuts, 0 = off (from the next reply)",
            int_setting),
    numeric("mirostat-tau", "T", "mirostat's target surprise in bits (from the next reply)"),
    numeric("mirostat-eta", "E", "mirostat's learning rate (from the next reply)"),
    numeric("repeat-penalty", "R", "discourage the last repeat-last-n tokens, 1 = off (from the next reply)"),
    numeric("repeat-last-n", "N", "tokens the penalties count, -1 = all (from the next reply)", int_setting),
    numeric("presence-penalty", "P", "subtracted from tokens in the last repeat-last-n, 0 = off (from the next reply)"),
    numeric("frequency-penalty", "F", "subtracted per repeat in the last repeat-last-n, 0 = off (from the next "
            "reply)"),
    numeric("dry-multiplier", "M", "DRY: a token extending a repeat loses M x base^(length past the allowed), 0 = off "
            "(from the next reply)"),
    numeric("dry-base", "B", "how fast DRY's penalty grows with the repeat (from the next reply)"),
    numeric("dry-allowed-length", "N", "the longest repeat DRY leaves alone (from the next reply)", int_setting),
    numeric("dry-penalty-last-n", "N", "tokens DRY looks back over, -1 = all (from the next reply)", int_setting),
    CommandSpec("seed", "S|off", "sampling seed; off = a new seed per reply", required("seed", parse_seed)),
    numeric("max-tokens", "N", "longest reply in tokens", int_setting),
    CommandSpec("engine", "NAME", "decoding engine (from the next reply)", text_setting("engine", "engine")),
    CommandSpec("system", "TEXT", "set the system prompt", text_setting("system", "system_prompt")),
    CommandSpec("json", "on|off", "replies as JSON objects (from the next reply)", required("json", parse_json)),
    CommandSpec("schema", "FILE|off", "replies as JSON valid under the schema in FILE (from the next reply)",
                required("schema", form_file(lambda path: read_schema_file(path, "/schema")))),
    CommandSpec("grammar", "FILE|off", "replies in the language of the GBNF or Lark grammar in FILE (from the next "
                "reply)", required("grammar", form_file(lambda path: read_user_file(path, "/grammar")))),
    CommandSpec("file", "PATH", "put a text file into the message, fenced under its name",
                required("file", reading(attached_file))),
    CommandSpec("clear", "", "start a new conversation", no_args(Clear())),
    CommandSpec("retry", "", "regenerate the last reply", no_args(Retry())),
    CommandSpec("save", "[FILE]", "export the conversation as markdown", lambda text: Save(text or None)),
    CommandSpec("load", "[ID]", "reopen a saved conversation (no ID: list them)", parse_load),
    CommandSpec("stats", "", "figures for the last reply and the session", no_args(Stats())),
    CommandSpec("help", "", "list commands and keys", no_args(Help())),
    CommandSpec("quit", "", "exit", no_args(Quit())),
]
COMMANDS = {spec.name: spec for spec in SPECS}
KEYS_HELP = (
    "keys: Enter send · Shift+Enter/Ctrl+J newline · Up/Down recall · Tab complete · Esc stop reply · "
    "Ctrl+C stop, twice quit · Ctrl+R copy reply · Ctrl+O copy code · F2 panels"
)


def is_command(text: str) -> bool:
    return text.startswith("/")


def parse(text: str) -> Command:
    """The command typed in `text` (which starts with '/'); raises CommandError."""
    # The name ends at the first whitespace, a newline too (Ctrl+J); the arguments keep theirs.
    name, args = (text.strip()[1:].split(None, 1) + ["", ""])[:2]
    spec = COMMANDS.get(name)
    if spec is None:
        raise CommandError(f"unknown command '/{name}': type /help for the list")
    return spec.parse(args.strip())


def help_lines() -> list[str]:
    width = max(len(spec.usage) for spec in SPECS)
    return [f"{spec.usage:<{width}}  {spec.summary}" for spec in SPECS]


def help_text() -> str:
    """What /help shows: every command, then the keys."""
    return "\n".join(help_lines() + [KEYS_HELP])


def completions(text: str, engine_names: Sequence[str]) -> list[str]:
    """Full-line candidates completing `text`: command names, then engine names, 'off' and 'auto'."""
    name, space, arg = text[1:].partition(" ")
    if not space:
        return [f"/{spec.name} " if spec.args else f"/{spec.name}" for spec in SPECS if spec.name.startswith(name)]
    if name == "file":
        return [f"/file {path}" for path in path_candidates(arg)]
    values = {"engine": list(engine_names), "seed": ["off"], "budget": [AUTO]}.get(name, [])
    return [f"/{name} {value}" for value in values if value.startswith(arg)]


def complete(text: str, engine_names: Sequence[str]) -> tuple[str, list[str]]:
    """The line after Tab (extended to the candidates' common prefix) and the candidates."""
    candidates = completions(text, engine_names)
    if not candidates:
        return text, []
    return max(text, commonprefix(candidates), key=len), candidates


def hint(candidates: list[str]) -> str:
    """The line shown under the prompt after Tab: a lone command's usage, else the candidates."""
    name = candidates[0][1:].split(" ")[0] if len(candidates) == 1 else ""
    spec = COMMANDS.get(name)
    return (f"{spec.usage}  {spec.summary}" if spec else "  ".join(candidates)) or "no completion"
