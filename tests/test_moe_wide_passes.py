"""A wide pass over a MoE target streamed by expert routes to nearly every expert: from the width
where it is expected to route to experts.WHOLE_SHARE of a layer's experts, the ring loads it starts
move whole layers, the calls that find a whole layer in their slot fetch nothing, and the cost
model prices such a pass at the whole layers' bytes. The tokens and logits stay the in-memory
model's."""

import pytest
import torch
from gptq_moe_writer import EXPERTS, dense_model
from planned import streamed
from test_moe_gptq import NEW_TOKENS, PROMPT, SAMPLINGS, assert_specexec_emits_autoregressive_tokens, draft_of, loaded
from test_moe_streaming import expert_bytes, fetched_per_pass, moe, record_routes  # noqa: F401 (moe: a fixture)

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.autosize import Costs
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import probe_costs
from specchat.offload.experts import WHOLE_SHARE, whole_layer_tokens

TOP_K = 2  # the tiny MoEs' (gptq_moe_writer.tiny_moe)
WIDE = whole_layer_tokens(EXPERTS, TOP_K)  # 4 of the prompt's 9 tokens


def share(experts: int, routed: int, tokens: int) -> float:
    return 1 - (1 - routed / experts) ** tokens


@pytest.mark.parametrize(("experts", "routed", "tokens"), [(8, 2, 9), (128, 8, 36), (4, 2, 4), (8, 8, 1), (60, 4, 34)])
def test_whole_layers_from_the_first_width_expected_to_route_to_the_share(experts, routed, tokens):
    """Mixtral's 2 of 8 from 9 tokens, Qwen3-30B-A3B's 8 of 128 from 36, Qwen2-MoE's 4 of 60 from 34."""
    assert whole_layer_tokens(experts, routed) == tokens
    assert share(experts, routed, tokens) >= WHOLE_SHARE and (tokens == 1 or share(experts, routed, tokens - 1) < WHOLE_SHARE)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_after_a_wide_call_the_ring_loads_whole_layers_and_their_calls_fetch_nothing(moe, tmp_path, tier):
    """A 1-slot ring over 2 layers: the prompt's pass (9 tokens) fetches layer 0's routed experts,
    whose release has layer 1 loaded whole; layer 1's release has the next pass's layer 0 loaded
    whole; from then on the one-token passes load heads and fetch what they route to."""
    _, directory = moe
    sizes = expert_bytes(loaded(directory))
    assert WIDE <= len(PROMPT)
    with streamed(directory, tier, tmp_path, slots=1, whole_from=None) as (lm, offload):
        loads = []
        begin = offload.transport.begin
        offload.transport.begin = lambda layer, slot, whole: loads.append((layer, whole)) or begin(layer, slot, whole)
        fetched = [(got, [[set().union(*made)] if made else [] for made in calls])
                   for got, calls in fetched_per_pass(lm, offload, record_routes(lm))]
        fetching = [[0], [1], [0, 1], [0, 1]]  # per pass, the layers whose calls fetch
        for (got, calls), layers in zip(fetched, fetching, strict=True):
            assert got == sum(sizes[layer][e] for layer in layers for e in calls[layer][0])
        assert loads[:3] == [(1, True), (0, True), (1, False)]  # the ring loads of the first two passes
        assert offload.whole_from == WIDE


def test_a_ring_that_stages_the_whole_pass_never_moves_whole_layers(moe, tmp_path):
    """Each slot keeps one layer and the experts it fetched once: a whole load would move them again."""
    _, directory = moe
    with streamed(directory, "ram", tmp_path, slots=2, whole_from=None) as (lm, offload):
        loads = []
        begin = offload.transport.begin
        offload.transport.begin = lambda layer, slot, whole: loads.append(whole) or begin(layer, slot, whole)
        list(fetched_per_pass(lm, offload, record_routes(lm)))
        assert offload.whole_from == float("inf") and loads and not any(loads)


def test_with_the_experts_cached_a_wide_pass_still_fetches_only_what_the_cache_lacks(moe, tmp_path):
    """A whole load would move again what the cache holds (over 1 - WHOLE_SHARE of the experts)."""
    _, directory = moe
    room = sum(map(sum, expert_bytes(loaded(directory)))) * 2  # every expert's unit, and more
    with streamed(directory, "disk", tmp_path, slots=1, expert_cache=room, whole_from=None) as (lm, offload):
        loads = []
        begin = offload.transport.begin
        offload.transport.begin = lambda layer, slot, whole: loads.append(whole) or begin(layer, slot, whole)
        list(fetched_per_pass(lm, offload, record_routes(lm)))
        assert offload.whole_from == float("inf") and loads and not any(loads)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_specexec_with_whole_layers_for_wide_passes_emits_the_in_memory_tokens(moe, tmp_path, sampling):
    family, directory = moe
    memory = CausalLM(loaded(directory))
    reference = [t for e in AutoregressiveEngine(memory, []).generate(PROMPT, NEW_TOKENS, sampling) for t in e.token_ids]
    with streamed(directory, "disk", tmp_path, slots=1, whole_from=None) as (lm, offload):
        prompt = torch.tensor(PROMPT)
        got = lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache()))
        assert torch.equal(got, memory.logits(memory.hidden(prompt, torch.arange(prompt.numel()), new_cache())))
        assert_specexec_emits_autoregressive_tokens(lm, draft_of(dense_model(family, directory)), sampling, reference)


def test_the_probe_prices_wide_passes_at_the_whole_layers_bytes(moe, tmp_path):
    family, directory = moe
    with streamed(directory, "ram", tmp_path, slots=1, whole_from=None) as (lm, offload):
        layouts = offload.store.layouts
        heads, whole = sum(layouts[i].head for i in (0, 1)), sum(layouts[i].nbytes for i in (0, 1))
        assert [offload.pass_bytes_for(n) for n in (1, WIDE - 1, WIDE, 64)] == [heads, heads, whole, whole]
        costs = probe_costs(lm, draft_of(dense_model(family, directory)), cap=8)
    assert costs.wide_from == WIDE
    assert costs.wide_stream_s == pytest.approx(costs.stream_s * whole / heads)  # one link speed, two byte counts
    assert [costs.stream(n) for n in (WIDE - 1, WIDE)] == [costs.stream_s, costs.wide_stream_s]


def test_a_wide_pass_costs_the_link_its_whole_layers():
    costs = Costs(target_n=(1, 64), target_s=(0.1, 0.1), draft_b=(1,), draft_s=(0.01,), stream_s=0.2, staged=0.5,
                  wide_from=16, wide_stream_s=1.0)
    # drafting 0.05 s hides that much of the staged half: 0.2 - 0.05 unstaged at 15 tokens, 1.0 - 0.05 at 16
    assert costs.iteration(0.05, 15) == pytest.approx(0.05 + max(0.1, 0.15))
    assert costs.iteration(0.05, 16) == pytest.approx(0.05 + 0.95)
