"""A conversation as a markdown document, for /save."""

from specchat.tui.store import Conversation, StoredMessage

HEADINGS = {"user": "## User", "assistant": "## Assistant"}


def to_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    parts = [f"# {conversation.title}"]
    if conversation.system_prompt:
        parts.append(f"## System\n\n{conversation.system_prompt}")
    for message in messages:
        cut = "\n\n*(reply cut)*" if message.cut else ""
        parts.append(f"{HEADINGS[message.role]}\n\n{message.content}{cut}")
    return "\n\n".join(parts) + "\n"
