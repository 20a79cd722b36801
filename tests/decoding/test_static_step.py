"""The draft's static-shape step (decoding/static_step.py), run eagerly on the CPU: the shapes,
padding, masks and slot writes a CUDA graph captures give the rows the eager step gives, and a
SpecExec engine with it grows the same trees and emits the same tokens."""

import pytest
import torch
from helpers.engines import GREEDY, PROMPT, run
from helpers.graphs import FakeGraph, standing_in
from helpers.tiny import perturbed, tiny_qwen_config
from torch import nn
from transformers import Qwen2ForCausalLM

from specchat.bounded_attention import bound_attention
from specchat.cuda_graph import shapes_repeat
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.kvcache import cache_length, keep_slots, new_cache
from specchat.decoding.specexec import SPECEXEC, catch_up, grow
from specchat.decoding.static_step import (BUCKETS, LEAST_SPAN, draft_slots, span_for, stage_rows, static_draft,
                                           write_mask)
from specchat.decoding.tree import TreeShape
from specchat.decoding.forward import CausalLM
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.draft_attention import replace_attention
from specchat.models.fused_norms import fuse_norms
from specchat.quant.int4 import use_fused_only
from specchat.quant.int4_rtn import group_for, round_linears
from specchat.offload.host_embedding import host_lookup, keep_embedding_on_host
from specchat.quant.stacked import stack_projections

SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
CAPACITY = 128


def prefilled(lm, tokens):
    cache = new_cache()
    lm.hidden(torch.tensor(tokens), torch.arange(len(tokens)), cache)
    return cache


def grown(target, drafts, sampling) -> list[tuple[list[int], list[tuple]]]:
    """Each draft's SpecExec reply beside `target`: its tokens, and each tree's size, depth, accepted
    nodes and tokens."""
    outcomes = []
    for draft in drafts:
        engine = TreeEngine(SPECEXEC, target, draft, [], TreeShape(budget=12, max_depth=6))
        tokens, events = run(engine, sampling)
        outcomes.append((tokens, [(e.tree_size, e.depth, e.accepted, e.token_ids) for e in events]))
    return outcomes


def tree_mask(cached: int) -> torch.Tensor:
    """Three nodes after `cached` slots: node 0 and node 1 its child see the prefix; node 2 sees
    node 0 but not node 1 (siblings)."""
    mask = torch.zeros(3, cached + 3, dtype=torch.bool)
    mask[:, :cached] = True
    mask[0, cached] = mask[1, cached] = mask[1, cached + 1] = mask[2, cached] = mask[2, cached + 2] = True
    return mask


@pytest.fixture
def captured(monkeypatch) -> list[FakeGraph]:
    """CUDA's capture stood in for (helpers/graphs.py): the graphs made, in order, one memory pool."""
    graphs = []
    monkeypatch.setattr("specchat.decoding.static_step.capture_graph", standing_in(graphs))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 0))
    return graphs


def step_pair(static: CausalLM, cache, earlier: int) -> torch.Tensor:
    """Two rows, a bucket of 2, after the prompt and `earlier` such pairs."""
    start = len(PROMPT) + 2 * earlier
    return static.hidden(torch.tensor([5, 6]), torch.arange(start, start + 2), cache)


def test_a_span_is_the_power_of_two_from_the_least_that_holds_the_rows_or_the_capacity():
    assert [span_for(slots, 16, 100) for slots in (1, 16, 17, 33, 64, 65, 100)] == [16, 16, 32, 64, 64, 100, 100]


@pytest.mark.parametrize("least_span", [LEAST_SPAN, 16], ids=["the-capacity", "a-span-of-16"])
def test_a_padded_step_gives_the_eager_rows_and_slots(tiny_draft, least_span):
    static = static_draft(tiny_draft, CAPACITY, capture=False)
    static.least_span = least_span
    eager_cache, static_cache = prefilled(tiny_draft, PROMPT), prefilled(static, PROMPT)  # the first pass: eager
    cached = len(PROMPT)
    tokens, positions = torch.tensor([4, 8, 1]), torch.tensor([cached, cached + 1, cached + 1])
    eager = tiny_draft.hidden(tokens, positions, eager_cache, tree_mask(cached))
    padded = static.hidden(tokens, positions, static_cache, tree_mask(cached))  # padded to 4 rows
    span = min(least_span, CAPACITY)  # the 6 cached slots and 4 rows fit the least span
    assert list(static.inputs) == [(4, span)] and static.inputs[4, span].mask.shape == (1, 1, 4, span)
    # bitwise on the AMD EPYC (2026-11-28): masked slots add exact zeros, and these float64 products
    # sum in the same order at 4 rows as at 3
    assert torch.equal(padded, eager)
    assert cache_length(static_cache) == cache_length(eager_cache) == cached + 3  # the pad row is not held
    keep = torch.tensor([*range(cached), cached, cached + 1])  # node 0 and its child accepted
    for cache in (eager_cache, static_cache):
        keep_slots(cache, keep)
    after = [lm.hidden(torch.tensor([5]), torch.tensor([cached + 2]), cache)
             for lm, cache in ((tiny_draft, eager_cache), (static, static_cache))]
    assert torch.equal(after[0], after[1])  # one row, no mask: causal over the rest


@pytest.mark.parametrize("given", [True, False], ids=["a-tree-mask", "causal"])
def test_a_pad_row_sees_its_own_slot_alone_and_a_real_row_what_its_mask_lets_it(given):
    """Three real rows after 6 cached slots in a bucket of 4 over a span of 16: the pad row, whose
    keys land in slot 9, sees slot 9 alone; every other score is the dtype's min."""
    mask = tree_mask(6) if given else torch.ones(3, 9, dtype=torch.bool).tril(diagonal=6)
    additive = torch.full((4, 16), 7.0)  # a bucket's buffer, holding the last step's mask
    write_mask(additive, mask if given else None, 3, 6)
    expected = torch.full((4, 16), torch.finfo(torch.float32).min)
    expected[:3, :9].masked_fill_(mask, 0)
    expected[3, 9] = 0
    assert torch.equal(additive, expected)


def test_steps_wider_than_a_bucket_or_past_the_capacity_run_eagerly(tiny_draft):
    static = static_draft(tiny_draft, capacity=len(PROMPT) + 4, capture=False)
    cache = prefilled(static, PROMPT)
    wide = torch.arange(BUCKETS[-1] + 1) % 50
    assert static.hidden(wide[:8], torch.arange(6, 14), prefilled(static, PROMPT)).shape == (8, 32)  # past capacity
    assert not static.inputs  # no bucket was filled: both ran eagerly
    static.capacity = 1024
    static.hidden(wide, torch.arange(6, 6 + wide.numel()), cache)
    assert not static.inputs


@pytest.mark.parametrize(("free", "room"), [(0, 0), (1, 1), (3, 2), (100, 64), (BUCKETS[-1] - 1, BUCKETS[-2]),
                                            (BUCKETS[-1], BUCKETS[-1]), (BUCKETS[-1] + 88, BUCKETS[-1] + 88)])
def test_a_steps_room_is_the_widest_bucket_the_free_slots_hold_or_all_past_the_widest(tiny_draft, free, room):
    """A step is padded to its bucket, so below the widest bucket only a whole bucket fits; past it a
    wider step runs eagerly, unpadded, and may take every free slot."""
    static = static_draft(tiny_draft, capacity=len(PROMPT) + free, capture=False)
    assert static.room(prefilled(static, PROMPT)) == room


def test_a_drafts_slots_hold_its_context_and_tree_and_a_widest_bucket_past_them(tiny_draft):
    budget = 12
    static = static_draft(tiny_draft, draft_slots(len(PROMPT), budget), capture=False)
    cache = prefilled(static, PROMPT)
    end = len(PROMPT) + budget + 1  # the context and a tree with its root, held
    static.hidden(torch.arange(budget + 1) % 50, torch.arange(len(PROMPT), end), cache)
    assert static.room(cache) == BUCKETS[-1]
    static.hidden(torch.arange(BUCKETS[-1]) % 50, torch.arange(end, end + BUCKETS[-1]), cache)
    assert BUCKETS[-1] in {width for width, _ in static.inputs}  # at its static shapes, not eagerly
    assert draft_slots(len(PROMPT), budget, pads=0) == end  # an eager draft's rows need no pads


def test_a_new_conversations_cache_is_not_stepped_by_the_graphs_captured_on_the_last(tiny_draft, captured):
    static = static_draft(tiny_draft, CAPACITY, capture=True)
    last = prefilled(static, PROMPT)
    for step in range(3):  # eager, captured, replayed
        step_pair(static, last, step)
    other = [9, 3, 7, 7, 1, 2]
    new, eager_cache = prefilled(static, other), prefilled(tiny_draft, other)
    positions = torch.arange(len(other), len(other) + 2)
    rows = torch.tensor([5, 6])
    assert torch.equal(static.hidden(rows, positions, new), tiny_draft.hidden(rows, positions, eager_cache))
    assert len(captured) == 1 and not static.graphs  # the last cache's graph dropped, the new shape eager again


def test_a_tree_grows_no_further_than_the_reserved_slots(tiny_draft, monkeypatch):
    """Growing a tree runs more rows than it keeps; a static draft's growth stops where its
    reserved slots end, every step at a bucket's shapes, instead of growing the buffers."""
    shape, greedy = TreeShape(budget=64, max_depth=8, batch=8), SamplingParams(temperature=0.0)
    cache = new_cache()
    unbounded = grow(tiny_draft, cache, catch_up(tiny_draft, cache, torch.tensor(PROMPT), 0), shape, greedy)
    static = static_draft(tiny_draft, capacity=len(PROMPT) + 20, capture=False)
    cache = new_cache()
    root = catch_up(static, cache, torch.tensor(PROMPT), 0)  # a cache's first pass runs eagerly
    eager = []
    monkeypatch.setattr(CausalLM, "hidden", lambda *args: eager.append(args))
    bounded = grow(static, cache, root, shape, greedy)
    assert sum(unbounded.widths) > 20 >= sum(bounded.widths) == cache_length(cache) - len(PROMPT) > 8
    assert not eager
    assert bounded.tree.size == 64  # its children fill the budget all the same


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_specexec_with_the_static_step_grows_the_eager_trees(tiny_target, tiny_draft, sampling):
    """At spans of 16 slots up: the conversation outgrows one, so the steps attend over several."""
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    static = static_draft(tiny_draft, CAPACITY, capture=False)
    static.least_span = 16
    outcomes = grown(tiny_target, (tiny_draft, static), sampling)
    assert outcomes[0][0] == outcomes[1][0] == reference
    assert outcomes[0][1] == outcomes[1][1]  # tree for tree
    assert sum(accepted for _, _, accepted, _ in outcomes[1][1]) > 0
    assert len({span for _, span in static.inputs}) > 1


def embedding_on_host(draft: CausalLM) -> CausalLM:
    """A copy of `draft` whose input embedding is held on the host and looked up there, as a draft's
    is beside a GPU (offload/host_embedding.py); on this CPU the host is the device, and the static
    step's inputs are the rows it looks up, copied into its buffers, as on CUDA."""
    copy = perturbed(draft, 0.0, seed=0)
    keep_embedding_on_host(copy.model, copy.device, copy.dtype)
    return copy


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_looking_its_rows_up_on_the_host_grows_the_eager_trees(tiny_target, tiny_draft, sampling):
    hosted = embedding_on_host(tiny_draft)
    static = static_draft(hosted, CAPACITY, capture=False, lookup=host_lookup(hosted.model))
    static.least_span = 16
    outcomes = grown(tiny_target, (tiny_draft, static), sampling)
    assert outcomes[0] == outcomes[1]  # tokens, and tree for tree
    assert static.inputs and all(inputs.embeds is not None for inputs in static.inputs.values())


def test_a_host_lookup_fills_the_step_with_its_rows_and_zero_pads(tiny_draft):
    hosted = embedding_on_host(tiny_draft)
    static = static_draft(hosted, CAPACITY, capture=False, lookup=host_lookup(hosted.model))
    cache, cached = prefilled(static, PROMPT), len(PROMPT)  # the first pass: eager, through the module

    def on_the_device(ids):  # what a captured graph cannot do: a lookup on the host inside the step
        raise AssertionError("the static step looked its rows up through the model's embedding")

    hosted.model.get_input_embeddings().forward = on_the_device
    tokens = torch.tensor([4, 8, 1])
    padded = static.hidden(tokens, torch.tensor([cached, cached + 1, cached + 1]), cache, tree_mask(cached))
    eager = tiny_draft.hidden(tokens, torch.tensor([cached, cached + 1, cached + 1]), prefilled(tiny_draft, PROMPT),
                              tree_mask(cached))
    embeds = static.inputs[4, LEAST_SPAN if LEAST_SPAN < CAPACITY else CAPACITY].embeds
    table = tiny_draft.model.get_input_embeddings().weight
    assert torch.equal(embeds[0, :3], table[tokens]) and not embeds[0, 3].any()
    assert torch.equal(padded, eager)


def test_staged_rows_are_the_tables_rows_and_zeros_after_them_whatever_the_staging_held():
    table, staging = torch.arange(20.0).view(10, 2), torch.full((4, 2), 7.0)  # a wider step's rows left behind
    stage_rows(staging, table, torch.tensor([3, 0]))
    assert torch.equal(staging, torch.tensor([[6.0, 7.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("for_cuda", [False, True], ids=["as-rounded", "stacked-fused"])
def test_a_4_bit_rounded_draft_at_static_shapes_grows_the_eager_trees(tiny_target, sampling, for_cuda):
    """--draft-quant int4, the draft a GPU captures: its linears rounded to 4 bits (float32, wide
    enough for the groups), the fused kernel at every width so that a row does not depend on the
    rows padded beside it (quant/int4.py's use_fused_only); `for_cuda`: prepared further as a CUDA
    draft is (models/draft_approx.py), its packed projections stacked, its norms fused and its
    grouped attention packed. The CUDA capture of the same step is gpu_checks/captured_draft.py's."""
    torch.manual_seed(2)
    model = Qwen2ForCausalLM(tiny_qwen_config(vocab_size=50, hidden_size=64, intermediate_size=128)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked, as helpers.tiny's: drafts are accepted
    # k and v have 32 outputs: a whole CPU tile under AVX2 (4-bit), half of one under AVX-512 (dense)
    kv_packed = group_for(nn.Linear(64, 32), torch.device("cpu")) is not None
    for layer in model.model.layers:
        assert round_linears(layer, torch.float32, torch.device("cpu")) == (7 if kv_packed else 5)
        if for_cuda:  # gate and up stacked, and q/k/v where k and v are 4-bit
            assert stack_projections(layer, packed=True) == 1 + kv_packed and fuse_norms(layer) == 2
            assert replace_attention(layer) == kv_packed  # stacked q/k/v: the draft's attention; else transformers'
            assert bound_attention(layer) == 1  # 4 query heads on 2 KV heads, packed
    assert use_fused_only(model) == (4 if for_cuda else 5 + 2 * kv_packed) * len(model.model.layers)
    draft = CausalLM(model)
    outcomes = grown(tiny_target, (draft, static_draft(draft, CAPACITY, capture=False)), sampling)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    assert outcomes[0][0] == outcomes[1][0] == reference
    assert outcomes[0][1] == outcomes[1][1]  # tree for tree
    assert sum(accepted for _, _, accepted, _ in outcomes[1][1]) > 0


def test_every_static_step_runs_where_shapes_repeat_and_an_eager_one_does_not(tiny_draft):
    """A bucket's step, captured or not, may run kernels that plan once a shape (cuDNN's attention,
    bounded_attention.backends_for); the first pass of a cache and steps wider than a bucket may not."""
    static, seen = static_draft(tiny_draft, CAPACITY, capture=False), []
    hook = static.model.get_decoder().register_forward_pre_hook(lambda module, args: seen.append(shapes_repeat()))
    try:
        cache = prefilled(static, PROMPT)  # the first pass: eager
        step_pair(static, cache, 0)
        wide = BUCKETS[-1] + 1
        static.hidden(torch.arange(wide) % 50, torch.arange(len(PROMPT) + 2, len(PROMPT) + 2 + wide), cache)
    finally:
        hook.remove()
    assert seen == [False, True, False]


def test_captured_shapes_replay_the_eager_rows_from_one_pool(tiny_target, tiny_draft, monkeypatch):
    """The capture path with CUDA's calls stood in for: a shape runs eagerly at its first use, is
    captured at its second and replayed after; every capture shares the draft's one pool."""
    pools, captured = [], []

    def capture(run, pool):
        pools.append(pool)
        output = run()
        captured.append(FakeGraph(run, output))
        return captured[-1], output

    monkeypatch.setattr("specchat.decoding.static_step.capture_graph", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, len(pools)))
    static = static_draft(tiny_draft, CAPACITY, capture=True)
    static.least_span = 16
    outcomes = grown(tiny_target, (tiny_draft, static), GREEDY)
    assert outcomes[0] == outcomes[1]
    assert set(static.graphs) <= static.used and len(static.graphs) == len(captured) > 1  # each shape once
    assert all(graph.replays for graph in captured)  # every shape used a third time
    assert pools == [(0, 0)] * len(captured)


def test_a_shape_costs_a_replay_alone_from_the_use_after_its_uses_before_replay(tiny_draft, captured):
    """The --budget auto probe runs a size uses_before_replay() times untimed (decoding/probe.py), so
    that it times what a reply runs: a replay, with no eager run or capture (the capture's use
    replays too: on CUDA a capture records the step without running it)."""
    static = static_draft(tiny_draft, CAPACITY, capture=True)
    cache, seen, uses = prefilled(static, PROMPT), [], static.uses_before_replay()
    for step in range(uses + 2):
        step_pair(static, cache, step)
        seen.append((len(captured), sum(graph.replays for graph in captured)))
    assert seen[uses - 1] == (1, 1)  # the last untimed use captured the graph (and replayed it)
    assert seen[uses:] == [(1, 2), (1, 3)]  # from there each use replays it, capturing nothing


def test_each_iteration_counts_the_graphs_its_draft_captured(tiny_target, tiny_draft, captured):
    """A reply's events say where its captures (CUDA's stood in for) happened, one a shape at its
    second use, so that a measurement can leave those one-time costs out (gpu_check --pair)."""
    static = static_draft(tiny_draft, CAPACITY, capture=True)
    static.least_span = 16
    engine = TreeEngine(SPECEXEC, tiny_target, static, [], TreeShape(budget=12, max_depth=6))
    counted, seen = [], 0
    for event in engine.generate(PROMPT, 40, GREEDY):
        counted.append((event.graphs_captured, len(captured) - seen))
        seen = len(captured)
    assert [reported for reported, _ in counted] == [made for _, made in counted]
    assert static.graphs_captured() == seen > 1 and counted[-1] == (0, 0)  # the shapes repeat by the reply's end
