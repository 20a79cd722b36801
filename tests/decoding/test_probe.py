"""The startup probe of --budget auto: doubling sizes, and the context each timed pass follows,
passed over once for a model in memory and before every timed pass for a streamed one."""

from types import SimpleNamespace

import torch

from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import CONTEXT, REPEATS, Context, doubling, probe_costs, time_pass


class Counting:
    """A model whose forwards are recorded as (tokens, cached slots before it); `stream` as given."""

    def __init__(self, lm, stream=None) -> None:
        self.lm, self.stream, self.calls = lm, stream, []

    def hidden(self, tokens, positions, cache, mask=None):
        self.calls.append((len(tokens), cache.get_seq_length()))
        return self.lm.hidden(tokens, positions, cache, mask)

    def __getattr__(self, name: str):
        return getattr(self.lm, name)


def test_the_probe_times_doubling_sizes(tiny_target, tiny_draft):
    assert doubling(9) == [1, 2, 4, 8, 9]
    shares = []
    costs = probe_costs(tiny_target, tiny_draft, cap=8, done=shares.append)
    # one share a size measured, target's then draft's, out of the sizes both could reach (5 + 4)
    measured = len(costs.target_n) + len(costs.draft_b)
    assert shares == [sizes / 9 for sizes in range(1, measured + 1)]
    assert costs.target_n[0] == 1 and costs.target_n == tuple(sorted(costs.target_n)) and costs.target_n[-1] <= 9
    assert costs.draft_b[0] == 1 and all(seconds > 0 for seconds in costs.target_s + costs.draft_s)
    assert (costs.stream_s, costs.staged) == (0.0, 1.0)  # nothing streams


def test_a_model_in_memory_passes_over_the_context_once_and_each_timed_pass_follows_exactly_it(tiny_target,
                                                                                                tiny_draft):
    target, draft = Counting(tiny_target), Counting(tiny_draft)
    costs = probe_costs(target, draft, cap=8)
    for lm, sizes in ((target, costs.target_n), (draft, costs.draft_b)):
        timed = [(n, CONTEXT) for n in sizes for _ in range(REPEATS)]
        assert lm.calls == [(CONTEXT, 0)] + timed


def test_the_cut_back_context_holds_what_a_fresh_pass_over_it_writes(tiny_target):
    context = Context(tiny_target)
    cache = context.ready()
    time_pass(tiny_target, 8, False, context)
    assert context.ready() is cache and cache.get_seq_length() == CONTEXT
    fresh = new_cache()
    tiny_target.hidden(torch.arange(CONTEXT) % tiny_target.model.config.vocab_size, torch.arange(CONTEXT), fresh)
    for kept, made in zip(cache.layers, fresh.layers, strict=True):
        assert torch.equal(kept.keys, made.keys) and torch.equal(kept.values, made.values)


def test_a_streamed_model_passes_over_the_context_before_every_timed_pass(tiny_target):
    """The pass before a timed one leaves the ring and the expert cache as a reply's previous pass
    does, so a streamed model's context is passed over anew each time."""
    streamed = Counting(tiny_target, stream=SimpleNamespace(loading_whole=False))
    context = Context(streamed)
    for n in (1, 2):
        time_pass(streamed, n, False, context)
    assert streamed.calls == [call for n in (1, 2) for call in [(CONTEXT, 0), (n, CONTEXT)] * REPEATS]
