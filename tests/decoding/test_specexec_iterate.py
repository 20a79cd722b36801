"""One iteration of SpecExec's loop (specexec.iterate): what it reports of its time, read off
the synchronized clock at each boundary (the catch-up, the tree, the pass, the rest)."""

import torch

from specchat.decoding import specexec
from specchat.decoding.events import SamplingParams
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC, iterate
from specchat.decoding.tree import TreeShape

PROMPT = [3, 1, 4, 1, 5]


def test_an_iterations_times_are_the_spans_between_its_clock_readings(tiny_target, tiny_draft, monkeypatch):
    """Readings at the start, after the catch-up, after the tree, after the pass and at the end:
    10, 11, 13, 17 and 20 s; the draft has run the prompt's first two tokens, so it catches up on
    the other three."""
    readings = iter([10.0, 11.0, 13.0, 17.0, 20.0])
    monkeypatch.setattr(specexec, "now", lambda *devices: next(readings))
    seq, target_cache, draft_cache = list(PROMPT), new_cache(), new_cache()
    tiny_target.hidden(torch.tensor(seq[:-1]), torch.arange(len(seq) - 1), target_cache)
    tiny_draft.hidden(torch.tensor(seq[:2]), torch.arange(2), draft_cache)
    done = iterate(SPECEXEC, tiny_target, tiny_draft, (target_cache, draft_cache), seq, TreeShape(budget=8),
                   SamplingParams(0.0, 1.0, seed=0), 100, [])
    assert (done.catch_up, done.catch_up_s, done.draft_s, done.pass_s, done.wall_s) == (3, 1.0, 3.0, 4.0, 10.0)
