"""Predicted outputs (OpenAI's `prediction` on chat completions): text a reply is expected to
repeat much of, as when an editor asks a model to change a few lines of a file it sends whole.
Each SpecExec tree then holds, beside the draft's nodes, the prediction's tokens from where the
reply has followed them as a chain below the root (tree.add_chain), so a reply that repeats
them is accepted up to a chain an iteration, however weak the draft is there.

The verifier decides every token as always (the target's greedy or seeded sample at its
position), so the reply is exactly the one decoded without a prediction; a wrong prediction costs
only its chain's rows in the target's pass. A cursor follows the reply through the prediction as
its tokens are emitted: on a token the prediction does not hold next the reply has left it
(an edit), and the cursor finds its place again where the reply's last ALIGN tokens occur in the
prediction, the first occurrence after its last place, else the first anywhere (an edit that
moves text up)."""

from collections import defaultdict
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from specchat.quoted_code import quoted_code

ALIGN = 3  # tokens of the reply's end that place it in the prediction again after it left it


@dataclass
class Prediction:
    """One reply's predicted tokens and where the reply stands in them."""

    tokens: tuple[int, ...]
    at: int | None = 0  # the prediction's index the reply's next token is expected at; None: it has left them
    accepted: int = 0  # the reply's tokens that followed the prediction (OpenAI's accepted_prediction_tokens)
    recent: list[int] = field(default_factory=list)  # the reply's last ALIGN tokens
    last: int = 0  # where the reply last followed the prediction (the index past its token)
    starts: dict[tuple[int, ...], list[int]] = field(init=False)  # each ALIGN-gram's indices in `tokens`

    def __post_init__(self) -> None:
        starts = defaultdict(list)
        for index in range(len(self.tokens) - ALIGN + 1):
            starts[self.tokens[index:index + ALIGN]].append(index)
        self.starts = dict(starts)

    def accept(self, token: int) -> None:
        """The reply emitted `token`: move on past it, or find the reply's place again."""
        self.recent = [*self.recent[-(ALIGN - 1):], token]
        if self.at is not None and self.at < len(self.tokens) and self.tokens[self.at] == token:
            self.at += 1
            self.accepted += 1
            self.last = self.at
        else:
            self.at = self.aligned()

    def aligned(self) -> int | None:
        """The index after the first occurrence of the reply's last ALIGN tokens at or past where it
        last followed the prediction (else the first anywhere); None where they occur nowhere."""
        found = self.starts.get(tuple(self.recent), [])
        if not found:
            return None
        after = [start for start in found if start >= self.last - ALIGN]
        return (after or found)[0] + ALIGN

    def chain(self, length: int) -> tuple[int, ...]:
        """The next `length` predicted tokens at most, from where the reply stands (none where it
        has left the prediction)."""
        return () if self.at is None else self.tokens[self.at:self.at + length]

    @property
    def rejected(self) -> int:
        """The predicted tokens the reply did not follow (OpenAI's rejected_prediction_tokens)."""
        return len(self.tokens) - self.accepted


def quoted_prediction(message: str, tokenizer: PreTrainedTokenizerBase) -> Prediction | None:
    """The predicted output of a reply to `message` in the chat or `generate`: the code it quotes
    (quoted_code.py) as the reply's tokens would hold it; None where it quotes none. The reply may
    or may not repeat it (an edit does, an explanation mostly not), so no chain is scored until the
    reply's last ALIGN tokens occur in it: its opening fence, or a line it quotes."""
    tokens = tuple(tokenizer.encode(quoted_code(message), add_special_tokens=False))
    return Prediction(tokens, at=None) if tokens else None
