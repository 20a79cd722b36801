"""A reply's token log (token_log.py): each emitted token's log-probability under the logits it was
sampled from, worked out in float64, and the likeliest alternatives there only where asked for."""

import math

import pytest
import torch

from specchat.decoding.token_log import TokenLog

LOGITS = torch.tensor([0.0, 2.0, 0.0, 1.0])  # float32, as every pass's LM head gives them
# torch's float64 log_softmax and Python's sum differ by 5.6e-17 at most here (one ulp of 0.49);
# float32 would be 1e-8 off.
ULPS = 1.11e-16  # twice that


def logprob(logits: torch.Tensor, token: int) -> float:
    """log softmax(logits)[token] in Python's float64: l - log(sum(exp(l)))."""
    values = logits.tolist()
    return values[token] - math.log(sum(math.exp(value) for value in values))


def test_a_log_by_default_keeps_no_alternatives():
    log = TokenLog()
    log.record(LOGITS, 3)
    [entry] = log.entries
    assert (entry.token, entry.top) == (3, ())
    assert entry.logprob == pytest.approx(logprob(LOGITS, 3), abs=ULPS)


def test_the_likeliest_alternatives_come_likeliest_first():
    log = TokenLog(top=2)
    log.record(LOGITS, 0)
    log.record(LOGITS.flip(0), 2)
    assert [entry.token for entry in log.entries] == [0, 2]
    assert [[token for token, _ in entry.top] for entry in log.entries] == [[1, 3], [2, 0]]
    assert [value for _, value in log.entries[0].top] == pytest.approx([logprob(LOGITS, 1), logprob(LOGITS, 3)],
                                                                       abs=ULPS)


def test_logprobs_are_worked_out_in_float64():
    """A near-certain token's log-probability, -log(1 + 2e^-30) = -1.87e-13: float32's log_softmax
    rounds it to 0. (Within 3.8e-16: torch takes log(1 + x), not log1p(x), and lands 1.9e-16 off.)"""
    log = TokenLog()
    log.record(torch.tensor([30.0, 0.0, 0.0]), 0)
    assert log.entries[0].logprob == pytest.approx(-math.log1p(2 * math.exp(-30.0)), abs=3.8e-16)
