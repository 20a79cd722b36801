"""A model whose forwards alone move a fake clock, beside a weight stream whose every figure is
its own power of two: an engine's events can then be checked for their own time and bytes exactly."""

from dataclasses import dataclass

import pytest

from specchat.decoding.forward import CausalLM
from specchat.transfer import TransferStats


class Clock:
    """A perf_counter that only the models' forwards move."""

    def __init__(self) -> None:
        self.now = 17.0  # not 0: a duration is a difference of two readings, never their sum

    def __call__(self) -> float:
        return self.now


class TokenStream:
    """A weight stream that counts, per token run, one byte, and seconds of the link's loads, of
    compute's stalls (a quarter of them at a pass's start) and of the link's idling, each its own
    power of two, so that a figure taken from the wrong counter or the wrong interval shows."""

    LOAD_S, STALL_S, START_STALL_S, IDLE_S = 0.5, 0.25, 0.0625, 0.125

    def __init__(self) -> None:
        self.tokens = 0

    def stats(self) -> TransferStats:
        n = self.tokens
        return TransferStats(bytes=n, transfer_s=n * self.LOAD_S, stall_s=n * self.STALL_S,
                             idle_s=n * self.IDLE_S, start_stall_s=n * self.START_STALL_S)


def assert_moved(event, tokens: int, wall_s: float) -> None:
    """`event` reports the link's figures for `tokens` run in `wall_s`, its idle share of that wall."""
    assert event.transfer_bytes == tokens
    assert (event.transfer_s, event.stall_s, event.start_stall_s) == (
        tokens * TokenStream.LOAD_S, tokens * TokenStream.STALL_S, tokens * TokenStream.START_STALL_S)
    assert event.link_idle == pytest.approx(tokens * TokenStream.IDLE_S / wall_s, rel=1e-12)


@dataclass
class Metered(CausalLM):
    """A model whose every forward costs `cost` seconds on `clock`."""

    clock: Clock | None = None
    cost: float = 0.0

    def hidden(self, tokens, positions, cache, mask=None):
        self.clock.now += self.cost
        if self.stream is not None:
            self.stream.tokens += tokens.numel()
        return super().hidden(tokens, positions, cache, mask)
