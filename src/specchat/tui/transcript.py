"""The conversation as the app keeps it: what was said, and where each message is stored."""

from dataclasses import dataclass

TITLE_LENGTH = 60


@dataclass(frozen=True)
class Entry:
    role: str  # "user" or "assistant"
    content: str
    cut: bool
    message_id: int

    def as_message(self) -> dict:
        return {"role": self.role, "content": self.content}


def title_of(first_message: str) -> str:
    line = first_message.strip().splitlines()[0]
    return line if len(line) <= TITLE_LENGTH else line[:TITLE_LENGTH - 1] + "…"


def system_messages(system_prompt: str) -> list[dict]:
    return [{"role": "system", "content": system_prompt}] if system_prompt else []
