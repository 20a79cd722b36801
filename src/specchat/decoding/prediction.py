"""Predicted outputs (OpenAI's `prediction` on chat completions): text a reply is expected to
repeat much of, as when an editor asks a model to change a few lines of a file it sends whole.
Each SpecExec tree then holds, beside the draft's nodes, the prediction's tokens from where the
reply has followed them as a chain below the root (specexec.add_chain), so a reply that repeats
them is accepted up to a chain an iteration, however weak the draft is there.

The verifier decides every token as always (the target's greedy or seeded sample at its
position), so the reply is exactly the one decoded without a prediction; a wrong prediction costs
only its chain's rows in the target's pass. A cursor follows the reply through the prediction as
its tokens are emitted: on a token the prediction does not hold next the reply has left it
(an edit), and the cursor finds its place again where the reply's last ALIGN tokens occur in the
prediction, the first occurrence after its last place, else the first anywhere (an edit that
moves text up). The chain is twice as long as the reply's current run of followed tokens (at least
SHORTEST): a CPU pays a pass by its rows, and a reply that has just found its place again, or is
about to leave it for an edit, follows fewer tokens than a long unchanged run."""

from collections import defaultdict
from dataclasses import dataclass, field

ALIGN = 3  # tokens of the reply's end that place it in the prediction again after it left it
SHORTEST = 4  # the chain's length before the reply has followed the prediction for 2 tokens running


@dataclass
class Prediction:
    """One reply's predicted tokens and where the reply stands in them."""

    tokens: tuple[int, ...]
    at: int | None = 0  # the prediction's index the reply's next token is expected at; None: it has left them
    accepted: int = 0  # the reply's tokens that followed the prediction (OpenAI's accepted_prediction_tokens)
    recent: list[int] = field(default_factory=list)  # the reply's last ALIGN tokens
    last: int = 0  # where the reply last followed the prediction (the index past its token)
    run: int = 0  # the reply's tokens that followed it since it last left it
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
            self.run += 1
            self.last = self.at
        else:
            self.at, self.run = self.aligned(), 0

    def aligned(self) -> int | None:
        """The index after the first occurrence of the reply's last ALIGN tokens at or past where it
        last followed the prediction (else the first anywhere); None where they occur nowhere."""
        found = self.starts.get(tuple(self.recent), [])
        if not found:
            return None
        after = [start for start in found if start >= self.last - ALIGN]
        return (after or found)[0] + ALIGN

    def chain(self, limit: int) -> tuple[int, ...]:
        """The next predicted tokens from where the reply stands, twice its run of followed ones
        (SHORTEST at least, `limit` at most); none where it has left the prediction."""
        length = min(limit, max(SHORTEST, 2 * self.run))
        return () if self.at is None else self.tokens[self.at:self.at + length]

    @property
    def rejected(self) -> int:
        """The predicted tokens the reply did not follow (OpenAI's rejected_prediction_tokens)."""
        return len(self.tokens) - self.accepted
