"""A reply's token log (token_log.py): each emitted token's log-probability under the logits it was
sampled from, worked out in float64, and the likeliest alternatives there only where asked for."""

import math

import pytest
import torch

from specchat.decoding.token_log import TokenLog

LOGITS = torch.tensor([0.0, 2.0, 0.0, 1.0])  # float32, as every pass's LM head gives them
FLOAT64 = torch.log_softmax(LOGITS.double(), dim=-1).tolist()  # float32's would differ by ~1e-8


def test_a_log_by_default_keeps_no_alternatives():
    log = TokenLog()
    log.record(LOGITS, 3)
    [entry] = log.entries
    assert (entry.token, entry.logprob, entry.top) == (3, FLOAT64[3], ())


def test_the_likeliest_alternatives_come_likeliest_first():
    log = TokenLog(top=2)
    log.record(LOGITS, 0)
    log.record(LOGITS.flip(0), 2)
    assert [entry.token for entry in log.entries] == [0, 2]
    assert log.entries[0].top == ((1, FLOAT64[1]), (3, FLOAT64[3]))
    assert [token for token, _ in log.entries[1].top] == [2, 0]


def test_logprobs_are_worked_out_in_float64():
    """A near-certain token's log-probability, -log(1 + 2e^-30) = -1.8715e-13, which float32's
    log_softmax rounds to 0. Within 2e-3 of it: torch takes log(1 + x), not log1p(x), and each
    rounding near 1 moves the result by up to 1.1e-16 (measured 1.9e-16 off, 1.0e-3 of it)."""
    log = TokenLog()
    log.record(torch.tensor([30.0, 0.0, 0.0]), 0)
    assert log.entries[0].logprob == pytest.approx(-math.log1p(2 * math.exp(-30.0)), rel=2e-3)
