"""What the copy keys put on the clipboard."""

import re

FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def last_code_block(markdown: str) -> str | None:
    """The body of the last complete fenced code block in `markdown`, if any."""
    blocks = FENCE.findall(markdown)
    return blocks[-1][1].removesuffix("\n") if blocks else None
