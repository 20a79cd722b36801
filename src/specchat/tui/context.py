"""Fitting a conversation into the target's context window by dropping the oldest turns.

Turns once dropped stay out: each prompt then starts where the last one did, so it extends the
sequence the engine's caches hold and only its new tokens are prefilled. When the conversation
outgrows the window, enough turns go at once for the prompt to fill at most REFILL of its room:
one full prefill, then several turns that append to it before the next drop.
"""

from collections.abc import Callable
from dataclasses import dataclass

from specchat.limits import reply_limit

Encode = Callable[[list[dict]], list[int]]


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    dropped: int  # oldest messages left out to make room
    max_new_tokens: int


REFILL = 0.75  # share of the prompt's room a prompt fills right after turns were dropped


def room_to_keep(context: int, max_tokens: int) -> int:
    """The room kept free for a reply when deciding which turns to drop (the reply's own limit is
    limits.reply_limit): a full reply, but never more than half the window, so that a long
    max-tokens setting does not push out the whole conversation."""
    return min(max_tokens, context // 2)


def fit_prompt(system: list[dict], turns: list[dict], encode: Encode, context: int, max_tokens: int,
               start: int = 0) -> Prompt:
    """Encode `system` + turns[start:] (the first `start` turns were dropped before), dropping
    more when that leaves no room for a reply (see the module's docstring).

    Turns are dropped oldest first, a user message together with the reply that follows it,
    so the model never sees a reply without its question; the last message always stays: where
    even it leaves no room for a reply, ContextOverflow.
    """
    limit = context - room_to_keep(context, max_tokens)
    start = min(start, len(turns) - 1)
    ids = encode(system + turns[start:])
    if len(ids) > limit:
        while len(ids) > int(limit * REFILL) and start < len(turns) - 1:
            start = next_user_turn(turns, start)
            ids = encode(system + turns[start:])
    return Prompt(ids=ids, dropped=start, max_new_tokens=reply_limit(len(ids), max_tokens, context))


def next_user_turn(turns: list[dict], start: int) -> int:
    """Index of the first user message after `start`, or of the last message if none."""
    for index in range(start + 1, len(turns)):
        if turns[index]["role"] == "user":
            return index
    return len(turns) - 1
