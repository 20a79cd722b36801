"""The code a message quotes (quoted_code.py): its fenced blocks as a reply quoting them writes
them, whatever fence the message used, and nothing for text that only looks like code."""

from specchat.quoted_code import quoted_code


def test_each_fenced_block_is_written_as_a_reply_writes_it():
    message = ("Rename n:\n\n```python\ndef f(n):\n    return n\n```\n\nand this one\n\n~~~~\nx = 1\n~~~~\n"
               "\n````markdown\n```bash\nls\n```\n````\n")
    assert quoted_code(message) == ("```python\ndef f(n):\n    return n\n```\n```\nx = 1\n```\n"
                                    "```markdown\n```bash\nls\n```\n```")


def test_a_message_without_a_fence_quotes_nothing():
    assert quoted_code("What does `len(x)` return?\n\n    indented, not fenced\n") == ""
    assert quoted_code("") == ""


def test_an_unclosed_fence_runs_to_the_end_of_the_message():
    """CommonMark: a block whose closing fence never comes ends with the message, as a paste cut short."""
    assert quoted_code("Fix:\n```js\nlet a = 1;\n") == "```js\nlet a = 1;\n```"
