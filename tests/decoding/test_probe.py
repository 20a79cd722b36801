"""The startup probe of --budget auto: doubling sizes, and the context each timed pass follows,
passed over once for a model in memory and before every timed pass for a streamed one; a
captured draft's sizes timed as replays."""

from types import SimpleNamespace

import torch
from helpers.graphs import standing_in

from specchat.decoding import probe, static_step
from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import CONTEXT, REPEATS, Context, doubling, probe_costs, time_pass
from specchat.decoding.static_step import bucket_for, static_draft


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


def test_a_captured_draft_is_timed_replaying_as_a_reply_runs_it(tiny_draft, monkeypatch):
    """A draft captured as CUDA graphs uses a shape eagerly first and captures it at its second
    use: each size runs both untimed, so every timed region (between two readings of the device
    clock) holds one replay and no capture. Timed from its first use, a size cost an eager step."""
    graphs = []
    monkeypatch.setattr(static_step, "capture_graph", standing_in(graphs))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 0))
    static = static_draft(tiny_draft, 128, capture=True)
    readings = []
    monkeypatch.setattr(probe, "now", lambda device: readings.append(
        (static.graphs_captured(), sum(graph.replays for graph in graphs))) or 0.0)
    context, sizes = Context(static), (1, 2, 4, 8)
    for n in sizes:
        time_pass(static, n, True, context)
    assert len(readings) == 2 * REPEATS * len(sizes)
    for (captured, replays), (captured_after, replays_after) in zip(readings[::2], readings[1::2]):
        assert (captured_after, replays_after) == (captured, replays + 1)
    assert static.graphs_captured() == len({bucket_for(n) for n in sizes}) > 1
