"""The conversations a plan keeps KV room for (plan/conversations.py): `serve --slots N` counts a
target and a draft KV cache for each of N kept conversations, so that N long conversations cannot
run the device out of memory mid-reply; `--slots auto` keeps four where their caches displace no
layer and shrink nothing, else one. Sizes from the shipped configs, written out here."""

import pytest
import torch
from helpers.plan_sizes import GB, NOWHERE, TREE, kv_per_token

from specchat.plan.machine import Machine, described_rooms
from specchat.plan.conversations import AUTO_SLOTS, run_of
from specchat.plan.pair import plan_pair
from specchat.plan.request import Pair, PlanRequest

PAPER_PAIR = Pair("llama-3.1-70b-awq", torch.bfloat16, draft="llama-3.1-8b-awq", draft_kinds=("none",))
EMBEDDED_PAIR = Pair("qwen2.5-coder-1.5b", torch.bfloat16, draft="qwen2.5-coder-0.5b", draft_kinds=("int8",),
                     draft_vocab=32768)


def on_a_card(conversations: int | None):
    """The paper's AWQ pair on a described 24 GB card with 64 GB of RAM."""
    request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE, conversations=conversations)
    return plan_pair(PAPER_PAIR, request, Machine(vram_gb=24, ram_gb=64))


def on_a_cpu(conversations: int | None, ram_gb: float):
    request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=1025, conversations=conversations)
    return plan_pair(EMBEDDED_PAIR, request, Machine(rooms=described_rooms(None, ram_gb * GB)))


def kv_items(memory) -> dict[str, int]:
    return {item.what: item.nbytes for item in memory.items if " KV " in item.what}


def test_each_conversation_kept_has_a_target_and_a_draft_kv_cache_in_the_plan():
    tokens = 4096 + TREE
    one, three = on_a_card(1), on_a_card(3)
    assert kv_items(one) == {f"target KV cache ({tokens} tokens)": kv_per_token(80, 8) * tokens,
                             f"draft KV cache ({tokens} tokens)": kv_per_token(32, 8) * tokens}
    kept = f"3 conversations of {tokens} tokens"
    assert kv_items(three) == {f"target KV caches ({kept})": 3 * kv_per_token(80, 8) * tokens,
                               f"draft KV caches ({kept})": 3 * kv_per_token(32, 8) * tokens}
    assert (one.conversations, three.conversations) == (1, 3)
    # the two more conversations' 2 x 2.82 GB of caches come out of the card's resident layers (0.45 GB each)
    layer = one.placement.layers[0]
    displaced = 2 * (kv_per_token(80, 8) + kv_per_token(32, 8)) * tokens
    assert one.placement.resident - three.placement.resident == pytest.approx(displaced / layer, abs=1)


def test_auto_keeps_one_conversation_where_more_would_displace_the_cards_layers():
    assert on_a_card(AUTO_SLOTS).placement.resident < on_a_card(1).placement.resident
    auto = on_a_card(None)
    assert auto.conversations == 1 and run_of(auto) == run_of(on_a_card(1))


def test_auto_keeps_four_where_the_room_holds_their_caches_beside_every_layer():
    auto, one = on_a_cpu(None, 24), on_a_cpu(1, 24)
    assert auto.conversations == AUTO_SLOTS == 4 and auto.placement.resident == 28 and run_of(auto) == run_of(one)
    assert sum(kv_items(auto).values()) == AUTO_SLOTS * sum(kv_items(one).values())


def test_auto_keeps_one_where_four_would_stream_more_from_the_disk_and_n_is_kept_as_asked():
    """6 GB of RAM: the pair streams from the disk already (11 of 28 layers resident); four
    conversations' caches would stream more (5 resident)."""
    one, four, auto = on_a_cpu(1, 6), on_a_cpu(AUTO_SLOTS, 6), on_a_cpu(None, 6)
    assert four.placement.resident < one.placement.resident and four.conversations == AUTO_SLOTS
    assert auto.conversations == 1 and run_of(auto) == run_of(one)
