"""The code a message quotes: its fenced blocks (CommonMark's, as markdown-it parses them), each
written as a reply quoting it writes it. A reply to a message holding code (change it, fix it,
explain it) often repeats much of that code, so the chat and `generate` give it to SpecExec as the
reply's predicted output (decoding/prediction.py): scored as a chain in each tree once the reply
reaches it, never changing a token."""

from markdown_it import MarkdownIt

PARSER = MarkdownIt("commonmark")


def quoted_code(text: str) -> str:
    """`text`'s fenced code blocks, each as ```INFO, its lines and ``` (a reply's usual form), one
    after another; "" where it quotes none."""
    blocks = [token for token in PARSER.parse(text) if token.type == "fence"]
    return "\n".join(f"```{block.info}\n{block.content}```" for block in blocks)
