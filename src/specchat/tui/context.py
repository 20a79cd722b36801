"""Fitting a conversation into the target's context window by dropping the oldest turns.

Turns once dropped stay out: each prompt then starts where the last one did, so it extends the
sequence the engine's caches hold and only its new tokens are prefilled. When the conversation
outgrows the window, enough turns go at once for the prompt to fill at most REFILL of its room:
one full prefill, then several turns that append to it before the next drop.
"""

from collections.abc import Callable
from dataclasses import dataclass

Encode = Callable[[list[dict]], list[int]]


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    dropped: int  # oldest messages left out to make room
    max_new_tokens: int


REFILL = 0.75  # share of the prompt's room a prompt fills right after turns were dropped


class ContextOverflow(ValueError):
    """Even the system prompt and the last message alone leave no room for a reply."""


def reply_room(context_tokens: int, max_tokens: int) -> int:
    # Keep room for a full reply, but never more than half the window: a long max-tokens
    # setting must not push out the whole conversation.
    return min(max_tokens, context_tokens // 2)


def fit_prompt(system: list[dict], turns: list[dict], encode: Encode, context_tokens: int, max_tokens: int,
               start: int = 0) -> Prompt:
    """Encode `system` + turns[start:] (the first `start` turns were dropped before), dropping
    more when that leaves no room for a reply (see the module's docstring).

    Turns are dropped oldest first, a user message together with the reply that follows it,
    so the model never sees a reply without its question; the last message always stays.
    """
    limit = context_tokens - reply_room(context_tokens, max_tokens)
    start = min(start, len(turns) - 1)
    ids = encode(system + turns[start:])
    if len(ids) > limit:
        while len(ids) > int(limit * REFILL) and start < len(turns) - 1:
            start = next_user_turn(turns, start)
            ids = encode(system + turns[start:])
    room = context_tokens - len(ids)
    if room < 1:
        raise ContextOverflow(f"the message is too long for the {context_tokens}-token context: shorten it")
    return Prompt(ids=ids, dropped=start, max_new_tokens=min(max_tokens, room))


def next_user_turn(turns: list[dict], start: int) -> int:
    """Index of the first user message after `start`, or of the last message if none."""
    for index in range(start + 1, len(turns)):
        if turns[index]["role"] == "user":
            return index
    return len(turns) - 1
