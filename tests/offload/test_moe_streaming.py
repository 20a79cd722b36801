"""MoE targets streamed by expert (offload/experts.py): a streamed layer's ring load moves its head,
and each call fetches the experts its router picked, and only those. The bytes fetched are
counted here from the routers' own choices, the model's logits are those of the model in memory,
and SpecExec's tokens transformers' own reply on the dequantized weights."""

import pytest
import torch
from helpers.gptq_moe_writer import dense_model
from helpers.moe import PROMPT, SAMPLINGS, assert_specexec_emits_transformers_tokens, draft_of, loaded
from helpers.moe_streams import expert_bytes, fetched_per_pass, moe, passes, record_routes
from helpers.planned import streamed

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.probe import probe_costs

CPU = torch.device("cpu")


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_each_call_fetches_exactly_the_experts_its_router_picked(moe, tmp_path, tier):
    _, directory = moe
    sizes = expert_bytes(loaded(directory))
    with streamed(directory, tier, tmp_path, slots=1) as (lm, offload):
        routes = record_routes(lm)
        for fetched, calls in fetched_per_pass(lm, offload, routes):
            # each call of a layer found its slot last held by the other layer: it fetched every
            # expert it routed to
            assert fetched == sum(sizes[layer][e] for layer, made in enumerate(calls) for call in made for e in call)
        narrow = [call for calls in routes for call in calls[1:]]  # the one-token passes'
        assert len(narrow) == 6 and all(len(call) == 2 for call in narrow)  # 2 of the 4 experts each


def test_a_ring_that_holds_the_whole_pass_fetches_an_expert_once(moe, tmp_path):
    _, directory = moe
    sizes = expert_bytes(loaded(directory))
    held: list[set[int]] = [set(), set()]
    with streamed(directory, "ram", tmp_path, slots=2) as (lm, offload):
        for fetched, calls in fetched_per_pass(lm, offload, record_routes(lm)):
            new = [set().union(*made) - held[layer] for layer, made in enumerate(calls)]
            assert fetched == sum(sizes[layer][e] for layer, experts in enumerate(new) for e in experts)
            held = [h | n for h, n in zip(held, new)]


@pytest.mark.parametrize("by_expert", [True, False], ids=["by-expert", "whole-layers"])
@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_moe_streamed_either_way_gives_the_in_memory_logits(moe, tmp_path, tier, by_expert):
    _, directory = moe
    memory = CausalLM(loaded(directory))
    with streamed(directory, tier, tmp_path, slots=1, by_expert=by_expert) as (lm, offload):
        cache, reference = new_cache(), new_cache()
        prompt = torch.tensor(PROMPT)
        got = lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), cache))
        assert torch.equal(got, memory.logits(memory.hidden(prompt, torch.arange(prompt.numel()), reference)))
        assert (offload.stats().fetched_bytes > 0) == by_expert


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_specexec_over_a_target_streamed_by_expert_emits_transformers_tokens(moe, tmp_path, sampling):
    family, directory = moe
    with streamed(directory, "disk", tmp_path, slots=1) as (lm, offload):
        assert_specexec_emits_transformers_tokens(lm, draft_of(dense_model(family, directory)),
                                                  dense_model(family, directory), sampling)
        assert offload.stats().fetched_bytes > 0


@pytest.mark.parametrize("by_expert", [True, False], ids=["by-expert", "whole-layers"])
def test_the_probe_prices_the_heads_as_the_pass_and_the_waits_for_experts_by_tokens(moe, tmp_path, by_expert):
    family, directory = moe
    with streamed(directory, "ram", tmp_path, slots=1, by_expert=by_expert) as (lm, offload):
        layers = offload.store.layouts
        heads, whole = sum(layers[i].head for i in (0, 1)), sum(layers[i].nbytes for i in (0, 1))
        assert offload.pass_bytes == (heads if by_expert else whole) and heads < whole
        before = offload.stats()
        costs = probe_costs(lm, draft_of(dense_model(family, directory)), cap=4)
        waited = (offload.stats() - before).fetch_wait_s
    if not by_expert:
        assert costs.fetch_s == ()  # nothing is fetched: the ring moves whole layers, staged
        return
    # a 1-slot ring fetches at every call; each size's wait is the mean of its 2 repeats, within
    # every wait the probe's passes made
    assert len(costs.fetch_s) == len(costs.target_n) and all(seconds > 0 for seconds in costs.fetch_s)
    assert sum(costs.fetch_s) <= waited


ROUTER_NEAR_TIE = 1e-4  # router logits this close may order either way between a tree pass and a sequential one


def test_a_tree_token_routes_to_the_experts_it_routes_to_in_sequence_but_at_a_router_near_tie(moe):
    """Routing is per token: a token scored inside a pass over many tokens gets the experts it
    gets when the tokens come one at a time, unless its k-th and (k+1)-th router logits are within
    float32's rounding of each other (a flip there is a near-tie, which the near-tie rule covers)."""
    _, directory = moe
    lm = CausalLM(loaded(directory))
    routes: list[tuple[torch.Tensor, torch.Tensor]] = []  # (logits [n, E], top-k index [n, k]) per router call
    for layer in lm.model.model.layers:
        layer.mlp.gate.register_forward_hook(lambda module, args, out: routes.append((out[0], out[2])))
    tokens = torch.tensor(PROMPT + [50, 60, 7, 8, 90, 11, 12])
    lm.hidden(tokens, torch.arange(tokens.numel()), new_cache())
    together = routes[:]  # one call per layer, every token at once
    routes.clear()
    cache = new_cache()
    for position, token in enumerate(tokens.tolist()):
        lm.hidden(torch.tensor([token]), torch.tensor([position]), cache)
    layers = len(together)
    flips = ties = 0
    for layer in range(layers):
        wide_index = together[layer][1]
        for position in range(tokens.numel()):
            logits, index = routes[position * layers + layer]
            if set(index[0].tolist()) != set(wide_index[position].tolist()):
                flips += 1
                ordered = logits[0].sort(descending=True).values
                k = index.shape[1]
                ties += bool(ordered[k - 1] - ordered[k] <= ROUTER_NEAR_TIE)
    assert flips == ties  # every flip, if any, at a near-tie
    print(f"{flips} of {layers * tokens.numel()} routes differ, all at router near-ties")


def test_experts_waiting_on_the_device_are_copied_into_the_slot_not_fetched(moe, tmp_path):
    _, directory = moe
    sizes = expert_bytes(loaded(directory))
    room = sum(map(sum, sizes)) * 2  # every expert's unit, and more
    held: list[set[int]] = [set(), set()]
    with streamed(directory, "disk", tmp_path, slots=1, expert_cache=room) as (lm, offload):
        for fetched, calls in fetched_per_pass(lm, offload, record_routes(lm)):
            # a 1-slot ring forgets every expert between calls; the cache does not: only an expert
            # never routed to before crosses the link
            new = [set().union(*made) - held[layer] for layer, made in enumerate(calls)]
            assert fetched == sum(sizes[layer][e] for layer, experts in enumerate(new) for e in experts)
            held = [h | n for h, n in zip(held, new)]
        assert set(offload.cache.places) == {(layer, e) for layer in (0, 1) for e in held[layer]}
        prompt = torch.tensor(PROMPT)
        memory = CausalLM(loaded(directory))
        assert torch.equal(lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache())),
                           memory.logits(memory.hidden(prompt, torch.arange(prompt.numel()), new_cache())))


def test_the_routing_counts_outlive_the_run_and_fill_the_next_runs_cache(moe, tmp_path):
    _, directory = moe
    unit = max(expert_bytes(loaded(directory))[0])
    with streamed(directory, "disk", tmp_path, slots=1, expert_cache=3 * unit) as (lm, offload):
        for _ in passes(lm):
            pass
        counts = dict(offload.cache.counts)
    assert offload.counts_file.is_file() and offload.counts_file.parent == tmp_path
    with streamed(directory, "disk", tmp_path, slots=1, expert_cache=3 * unit) as (lm, offload):
        assert dict(offload.cache.counts) == counts
        ranked = sorted(counts.values(), reverse=True)
        assert sorted((counts[key] for key in offload.cache.places), reverse=True) == ranked[:3]  # the 3 routed to most, from the start
