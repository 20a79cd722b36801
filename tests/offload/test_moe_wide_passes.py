"""A call of a MoE layer streamed by expert that routed to experts.WHOLE_SHARE of its experts has the
ring loads its release starts move whole layers, and the calls that find a whole layer in their
slot fetch nothing; not where the ring stages a whole pass or the expert cache holds the experts.
The cost model prices passes from the probed width whose calls did so at the whole layers' bytes.
The logits stay the in-memory model's, the tokens transformers' own reply on the dequantized weights."""

import math

import pytest
import torch
from helpers.gptq_moe_writer import EXPERTS, dense_model
from helpers.moe import PROMPT, SAMPLINGS, assert_specexec_emits_transformers_tokens, draft_of, loaded
from helpers.moe_streams import expert_bytes, fetched_per_pass, moe, record_routes  # noqa: F401 (moe: a fixture)
from helpers.planned import streamed

from specchat.decoding.autosize import Costs
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import probe_costs
from specchat.offload.experts import WHOLE_SHARE, SlotExperts


def ring_loads(offload) -> list[tuple[int, bool]]:
    """(layer, whole) of every ring load the transport begins from now on."""
    loads = []
    begin = offload.transport.begin
    offload.transport.begin = lambda layer, slot, whole: loads.append((layer, whole)) or begin(layer, slot, whole)
    return loads


def test_a_call_has_whole_layers_loaded_after_it_when_it_routed_to_the_share():
    held, off = SlotExperts(whole_loads=True), SlotExperts()
    assert [held.loads_whole(routed, 10) for routed in (8, 9, 10)] == [False, True, True]  # WHOLE_SHARE of 10
    assert not off.loads_whole(10, 10) and WHOLE_SHARE == 0.85
    assert [held.loads_whole(routed, 20) for routed in (16, 17)] == [False, True]  # exactly the share counts


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_after_a_call_routed_to_every_expert_the_next_layer_arrives_whole_and_fetches_nothing(moe, tmp_path, tier):
    """A 1-slot ring over 2 layers: call c's release starts call c + 1's load, whole if call c routed
    to all 4 experts; a call in a whole-loaded slot fetches nothing, any other its routed experts."""
    _, directory = moe
    sizes = expert_bytes(loaded(directory))
    with streamed(directory, tier, tmp_path, slots=1, whole_loads=True) as (lm, offload):
        loads = ring_loads(offload)
        routes = record_routes(lm)
        per_pass = fetched_per_pass(lm, offload, routes)
        calls = [(layer, route) for pass_calls in zip(*routes) for layer, route in enumerate(pass_calls)]
        wide = [len(route) >= WHOLE_SHARE * EXPERTS for _, route in calls]
        assert wide[0]  # the prompt's 9 tokens reach all 4 experts
        assert [whole for _, whole in loads[:len(calls) - 1]] == wide[:-1]
        expected = [0] * len(per_pass)
        for index, (layer, route) in enumerate(calls):
            if index == 0 or not wide[index - 1]:
                expected[index // 2] += sum(sizes[layer][e] for e in route)
        assert [fetched for fetched, _ in per_pass] == expected


def test_a_ring_that_stages_the_whole_pass_never_moves_whole_layers(moe, tmp_path):
    """Each slot keeps one layer and the experts it fetched once: a whole load would move them again."""
    _, directory = moe
    with streamed(directory, "ram", tmp_path, slots=2, whole_loads=True) as (lm, offload):
        loads = ring_loads(offload)
        list(fetched_per_pass(lm, offload, record_routes(lm)))
        assert loads and not any(whole for _, whole in loads)


def test_with_the_experts_cached_a_wide_call_still_fetches_only_what_the_cache_lacks(moe, tmp_path):
    """A whole load would move again what the cache holds (over 1 - WHOLE_SHARE of the experts)."""
    _, directory = moe
    room = sum(map(sum, expert_bytes(loaded(directory)))) * 2  # every expert's unit, and more
    with streamed(directory, "disk", tmp_path, slots=1, expert_cache=room, whole_loads=True) as (lm, offload):
        loads = ring_loads(offload)
        list(fetched_per_pass(lm, offload, record_routes(lm)))
        assert loads and not any(whole for _, whole in loads)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_specexec_with_whole_layers_after_wide_calls_emits_transformers_tokens(moe, tmp_path, sampling):
    family, directory = moe
    memory = CausalLM(loaded(directory))
    with streamed(directory, "disk", tmp_path, slots=1, whole_loads=True) as (lm, offload):
        loads = ring_loads(offload)
        prompt = torch.tensor(PROMPT)
        got = lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache()))
        assert torch.equal(got, memory.logits(memory.hidden(prompt, torch.arange(prompt.numel()), new_cache())))
        assert_specexec_emits_transformers_tokens(lm, draft_of(dense_model(family, directory)),
                                                  dense_model(family, directory), sampling)
        assert any(whole for _, whole in loads)


def test_the_probe_prices_passes_from_the_width_that_loads_whole_at_the_whole_layers_bytes(moe, tmp_path):
    family, directory = moe
    with streamed(directory, "ram", tmp_path, slots=1, whole_loads=True) as (lm, offload):
        layouts = offload.store.layouts
        heads, whole = sum(layouts[i].head for i in (0, 1)), sum(layouts[i].nbytes for i in (0, 1))
        assert (offload.pass_bytes, offload.whole_pass_bytes) == (heads, whole)
        costs = probe_costs(lm, draft_of(dense_model(family, directory)), cap=8)
    # one token routes to 2 of the 4 experts: never whole; 8 tokens reach all 4
    assert 1 < costs.wide_from < math.inf and costs.wide_from in costs.target_n
    assert costs.wide_stream_s == pytest.approx(costs.stream_s * whole / heads)  # one link speed, two byte counts
    assert [costs.stream(n) for n in (1, costs.wide_from)] == [costs.stream_s, costs.wide_stream_s]


def test_a_wide_pass_costs_the_link_its_whole_layers():
    costs = Costs(target_n=(1, 64), target_s=(0.1, 0.1), draft_b=(1,), draft_s=(0.01,), stream_s=0.2, staged=0.5,
                  wide_from=16, wide_stream_s=1.0)
    # drafting 0.05 s hides that much of the staged half: 0.2 - 0.05 unstaged at 15 tokens, 1.0 - 0.05 at 16
    assert costs.iteration(0.05, 15) == pytest.approx(0.05 + max(0.1, 0.15))
    assert costs.iteration(0.05, 16) == pytest.approx(0.05 + 0.95)
