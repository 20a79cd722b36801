"""Incremental detokenization: emit only text that can no longer change.

Decoding token by token breaks multi-byte characters and merged pieces, so the whole reply is
decoded each time and the new suffix is emitted, holding back a trailing replacement char
(an incomplete UTF-8 sequence).
"""

from transformers import PreTrainedTokenizerBase


class TextStream:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.emitted = ""

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def stable(self, count: int) -> str:
        """The text of the first `count` tokens less a trailing incomplete character, which the
        next token may complete."""
        return self.tokenizer.decode(self.token_ids[:count], skip_special_tokens=True).rstrip("\ufffd")

    def offset(self, count: int) -> int:
        """Where token `count` begins in the stable text (a token that completes a character
        begins where that character does)."""
        return len(self.stable(count))

    def reaching(self, chars: int, low: int = 0) -> int:
        """The fewest tokens whose stable text holds `chars` characters (all of them where it is
        shorter); equally, how many tokens begin before character `chars`. `low`: tokens known to
        begin before it. Offsets never fall as tokens are added, so a bisection takes log2(tokens) decodes."""
        high = len(self.token_ids)
        while low < high:
            middle = (low + high) // 2
            if self.offset(middle) < chars:
                low = middle + 1
            else:
                high = middle
        return low

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the newly stable text."""
        self.token_ids.extend(token_ids)
        text = self.stable(len(self.token_ids))
        # Byte-level BPE decoding is prefix-stable once complete characters are formed, so the
        # new text is the suffix past what was already shown.
        delta = text[len(self.emitted):]
        self.emitted = text if len(text) > len(self.emitted) else self.emitted
        return delta

    def finish(self) -> str:
        """At the end of a reply, whatever was held back (e.g. a character cut by the limit)."""
        delta = self.text[len(self.emitted):]
        self.emitted += delta
        return delta
