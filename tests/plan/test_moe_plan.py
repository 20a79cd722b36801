"""MoE pairs planned on virtual machines from the shipped configs alone: Mixtral-8x7B-GPTQ with the
paper's Mistral-7B draft, Qwen3-30B-A3B-GPTQ with Qwen3-0.6B, Qwen3-235B-A22B-GPTQ with Qwen3-1.7B.
Every byte count asserted here is the configs' arithmetic written out below, not the plan's own
output. A streamed MoE layer moves its head (attention, router, norms) and the experts its tokens
route to: a pass's bytes by tree width follow the experts a pass touches."""

import random
import re
from dataclasses import replace

import pytest
import torch
from helpers.cli import run_cli
from helpers.plan_sizes import (BF16, FP32, GB, NOWHERE, ROTARY_BYTES, assert_fits, int4_linear, item, kv_per_token,
                                llama_layer_linears, math_pass)
from transformers import Qwen2MoeConfig

from specchat.checkpoint.layout import LayerLayout
from specchat.errors import SpecchatError
from specchat.models.configs import read_config
from specchat.plan import model
from specchat.plan.budget import CUDA_MARGIN, EXPERT_CACHE, OS_RESERVE
from specchat.plan.demand import shape_of
from specchat.plan.experts import experts_touched
from specchat.plan.machine import RUNTIME_BYTES, Machine
from specchat.plan.pair import plan_pair
from specchat.plan.request import Pair, PlanRequest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

INT64 = 8
TREE = 2049  # the largest tree a GPU's --budget auto builds offloaded (2048), plus its root
CONTEXT = 4096
DIRECT_IO = 4096  # the layer file's alignment: each expert's unit starts on such a boundary


def attention(hidden: int, heads: int, kv_heads: int, group: int, act_order: bool) -> int:
    """q, k, v and o as 4-bit linears (head_dim 128)."""
    q, kv = heads * 128, kv_heads * 128
    return sum(int4_linear(i, o, group, act_order) for i, o in [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden)])


def experts(count: int, hidden: int, width: int, group: int, act_order: bool) -> int:
    """`count` experts of gate and up (hidden -> width) and down (width -> hidden), 4-bit each."""
    return count * (2 * int4_linear(hidden, width, group, act_order) + int4_linear(width, hidden, group, act_order))


def aligned(nbytes: int) -> int:
    return -(-nbytes // DIRECT_IO) * DIRECT_IO


def moe_layer(head: int, expert: int, count: int) -> int:
    """A MoE layer as the layer file lays it out: its head, then `count` experts' units, each on a
    direct-I/O boundary (the last one unpadded)."""
    return aligned(head) + (count - 1) * aligned(expert) + expert


# Mixtral's GPTQ: one group over all inputs and act-order; 8 experts of 14336; the router [8, 4096]
# and two norms in bf16. Qwen3-MoE's GPTQ: groups of 128, no act-order; 128 experts; the router
# [128, hidden], two norms and the q/k norms (head_dim 128) in bf16.
MIXTRAL_HEAD = attention(4096, 32, 8, -1, True) + (8 + 2) * 4096 * BF16
MIXTRAL_EXPERT = experts(1, 4096, 14336, -1, True)
MIXTRAL_LAYER = moe_layer(MIXTRAL_HEAD, MIXTRAL_EXPERT, 8)
QWEN3_30B_HEAD = attention(2048, 32, 4, 128, False) + (128 + 2) * 2048 * BF16 + 2 * 128 * BF16
QWEN3_30B_LAYER = moe_layer(QWEN3_30B_HEAD, experts(1, 2048, 768, 128, False), 128)
QWEN3_235B_HEAD = attention(4096, 64, 4, 128, False) + (128 + 2) * 4096 * BF16 + 2 * 128 * BF16
QWEN3_235B_LAYER = moe_layer(QWEN3_235B_HEAD, experts(1, 4096, 1536, 128, False), 128)
WIDTHS = (1, 16, 64, 1024)  # the tree tokens a pass's bytes are asserted at
NF4 = 0.5 + 4 / 64  # bitsandbytes: 4 bits a weight and a float32 absmax per block of 64


def nf4_draft(linears: list[tuple[int, int]], layers: int, other: int) -> int:
    """A draft in nf4: its decoder's `linears` in each of its `layers` at NF4 bytes a weight (each
    linear's rounded down), its `other` weights (embeddings, an untied head, norms) in bf16, and the
    rotary frequencies (head_dim 128)."""
    return layers * sum(int(i * o * NF4) for i, o in linears) + other * BF16 + ROTARY_BYTES


# mistral-7b: 32 layers as Llama's, an untied head over 32000 tokens; the Qwen3 drafts' heads are
# tied to their embeddings over 151936 (counted once), a layer's norms with q/k norms of 128.
MISTRAL_7B_NF4 = nf4_draft(llama_layer_linears(4096, 14336, 8), 32, 2 * 32000 * 4096 + (2 * 32 + 1) * 4096)
QWEN3_1_7B_NF4 = nf4_draft(llama_layer_linears(2048, 6144, 8), 28, 151936 * 2048 + 28 * (2 * 2048 + 2 * 128) + 2048)
QWEN3_0_6B_NF4 = nf4_draft([(1024, 2048), (1024, 1024), (1024, 1024), (2048, 1024), (1024, 3072), (1024, 3072),
                            (3072, 1024)], 28, 151936 * 1024 + 28 * (2 * 1024 + 2 * 128) + 1024)


def expansion(inputs: int, outputs: int) -> int:
    """CUDA's expansion of a 4-bit weight for a TREE-row input (quant/int4_expand.py): the weight in
    bf16, whole (a chunk holds 2**26 weights, more than these), and the product's TREE x outputs."""
    return (outputs * inputs + TREE * outputs) * BF16


# The 4-bit linears' largest temporary at TREE rows (quant/int4.py's bound, the largest of its
# products' here), and with act-order the input permuted in bf16. Mixtral: an expert's gate or up
# (4096 -> 14336) expanded, its input permuted (down's 14336 -> 4096 comes to as much). Qwen3-235B:
# q (4096 -> 8192) expanded, no act-order. Qwen3-30B: o's (4096 -> 2048) chunked float32 product:
# chunks of 2**20 // 4096 = 256 output rows, two nibble planes and the float32 chunk (6 bytes a
# weight), float32 scales and zeros per group of 128, the input widened to float32 and a chunk of
# output in float32 (its expansions take less).
MIXTRAL_WORKSPACE = TREE * 4096 * BF16 + expansion(4096, 14336)
QWEN3_235B_WORKSPACE = expansion(4096, 8192)
QWEN3_30B_WORKSPACE = 6 * 256 * 4096 + 2 * FP32 * 256 * (4096 // 128) + TREE * (4096 + 256) * FP32


def plan(target: str, draft: str, vram_gb: float, ram_gb: float, tree: int = TREE):
    pair = Pair(target, torch.bfloat16, draft=draft, draft_kinds=("none", "nf4"))
    return plan_pair(pair, PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=tree),
                     Machine(vram_gb=vram_gb, ram_gb=ram_gb))


def moe_pass(heads: int, kv_heads: int, hidden: int, experts: int, routed: int, width: int, tree: int) -> int:
    """A MoE target's pass over `tree` tokens after CONTEXT: a dense pass whose MLP is the k routed
    experts' products together, plus the router's logits (bf16), softmax (fp32) and top-k (fp32, int64)."""
    return math_pass(heads, kv_heads, 128, hidden, routed * width, CONTEXT, tree) + tree * experts * (BF16 + FP32) + \
        tree * routed * (FP32 + INT64)


def assert_streams_by_expert(memory, head: int, layer: int, experts: int, routed: int) -> None:
    """A pass over n tree tokens streams each streamed layer's head and, of its experts (the rest of
    the layer), the share E(1 - (1 - k/E)^n) / E it routes to: its k for one token, all at last."""
    placement = memory.placement
    streamed = len(placement.streamed)
    for n in WIDTHS:
        share = 1 - (1 - routed / experts) ** n
        expected = streamed * (aligned(head) + share * (layer - aligned(head)))
        assert placement.streamed_bytes(placement.streamed, share) == pytest.approx(expected, rel=1e-12)
    assert placement.pass_bytes == streamed * layer  # every expert routed to: whole layers


def room_for_layers(memory, vram_gb: float, others: int, layer: int) -> int:
    """The card's room beside `others` (the plan's every other device item, worked out by the test)
    and the smallest ring (two slots of a layer, each aligned for O_DIRECT), after checking that the
    plan fills it with as many resident layers as it holds, and that ring; returns the room left."""
    room = int(vram_gb * GB) - others - 2 * aligned(layer)
    placement = memory.placement
    assert (placement.resident, placement.slots) == (room // layer, 2)
    return room % layer


def assert_cache_fills_the_room_left(memory, room: int, expert: int, experts: int) -> None:
    """The `room` the plan leaves on the card holds as many of the streamed layers' experts as fit
    (each unit an expert's three linears), there for the most-routed ones."""
    places = min(experts * len(memory.placement.streamed), room // expert)
    assert item(memory, "the most-routed experts") == places * expert == memory.placement.expert_cache and places > 0


def test_a_moe_pass_holds_its_routed_experts_products_and_its_routers_scores():
    n, context = 1025, 4096
    mixtral = shape_of(read_config("mixtral-8x7b-gptq"), torch.bfloat16)
    assert mixtral.pass_bytes(context, n) == math_pass(32, 8, 128, 4096, 2 * 14336, context, n) + \
        n * 8 * (BF16 + FP32) + n * 2 * (FP32 + INT64)
    qwen3 = shape_of(read_config("qwen3-30b-a3b-gptq"), torch.bfloat16)
    assert qwen3.pass_bytes(context, n) == math_pass(32, 4, 128, 2048, 8 * 768, context, n) + \
        n * 128 * (BF16 + FP32) + n * 8 * (FP32 + INT64)
    # Qwen2-MoE's shared expert runs for every token beside the 4 routed ones
    shared = shape_of(Qwen2MoeConfig(hidden_size=64, num_attention_heads=4, intermediate_size=96, num_experts=16,
                                     num_experts_per_tok=4, moe_intermediate_size=32,
                                     shared_expert_intermediate_size=80), torch.bfloat16)
    assert shared.pass_bytes(context, n) == math_pass(4, 16, 16, 64, 4 * 32 + 80, context, n) + \
        n * 16 * (BF16 + FP32) + n * 4 * (FP32 + INT64)
    dense = shape_of(read_config("mistral-7b"), torch.bfloat16)  # a dense MLP, no router: as before
    assert dense.pass_bytes(context, n) == math_pass(32, 8, 128, 4096, 14336, context, n)


def test_experts_touched_by_n_tokens_follow_the_union_of_their_routes():
    # E(1 - (1 - k/E)^n): one token touches its k; Mixtral's 8 are all hit from 16 tokens, 82 of
    # Qwen3-30B-A3B's 128 at 16 (the figures)
    for n, mixtral, qwen3 in [(1, 2, 8), (16, 7.9198, 82.4225), (64, 8.0, 125.9423), (1024, 8.0, 128.0)]:
        assert experts_touched(8, 2, n) == pytest.approx(mixtral, abs=1e-4)
        assert experts_touched(128, 8, n) == pytest.approx(qwen3, abs=1e-4)
    rng = random.Random(3)  # the same count drawn: 2000 passes of 16 tokens, each routed to 8 distinct of 128
    drawn = [len({e for _ in range(16) for e in rng.sample(range(128), 8)}) for _ in range(2000)]
    assert sum(drawn) / len(drawn) == pytest.approx(experts_touched(128, 8, 16), abs=0.3)


def test_the_bounds_of_a_route_are_possible_routes():
    """One expert a token (a Switch Transformer's top-1), every expert a token, and a pass of no
    tokens, which touches none."""
    assert experts_touched(8, 1, 1) == 1 and experts_touched(8, 8, 1) == 8
    assert experts_touched(8, 2, 0) == 0


@pytest.mark.parametrize(("experts", "routed", "tokens"), [(8, 0, 4), (8, 9, 4), (0, 0, 4), (8, 2, -1)])
def test_experts_touched_refuses_impossible_routes_in_one_line(experts, routed, tokens):
    with pytest.raises(SpecchatError, match=r"^-?\d+ tokens routed to \d+ of \d+ experts: need ") as refused:
        experts_touched(experts, routed, tokens)
    assert "\n" not in str(refused.value)


# Mixtral's plan's device items besides its layers: fixed parts (the LM head and norm: the input
# embedding is on the host), both KV caches (the same per token), the nf4 draft, the largest pass, the kernels' workspace and the CUDA margin
MIXTRAL_OTHERS = (32000 * 4096 * BF16 + 4096 * BF16 + ROTARY_BYTES + 2 * kv_per_token(32, 8) * (CONTEXT + TREE)
                  + MISTRAL_7B_NF4 + moe_pass(32, 8, 4096, 8, 2, 14336, TREE) + MIXTRAL_WORKSPACE + CUDA_MARGIN)


def test_mixtral_8x7b_gptq_and_mistral_7b_on_a_24_gb_card_with_64_gb_of_ram():
    memory = plan("mixtral-8x7b-gptq", "mistral-7b", 24, 64)
    assert 0.74 * GB < MIXTRAL_LAYER <= 0.85 * GB and memory.placement.layers == (MIXTRAL_LAYER,) * 32
    # the LM head, the final norm and the rotary tables on the card; the input embedding on the host
    assert item(memory, "fixed parts (") == 32000 * 4096 * BF16 + 4096 * BF16 + ROTARY_BYTES
    assert item(memory, "fixed parts:") == 32000 * 4096 * BF16
    tokens = CONTEXT + TREE
    assert item(memory, "target KV cache") == item(memory, "draft KV cache") == kv_per_token(32, 8) * tokens
    assert item(memory, "largest pass") == moe_pass(32, 8, 4096, 8, 2, 14336, TREE)  # the draft's dense one is less
    assert item(memory, "draft weights (nf4)") == MISTRAL_7B_NF4
    assert item(memory, "quantized kernels' workspace") == MIXTRAL_WORKSPACE
    placement = memory.placement
    assert placement.disk == 0 and placement.resident + placement.ram == 32
    # five 0.75 GB layers a 4 GiB buffer: 14 = 2 x 5 + 4, the four in 2 GiB (two) and 1 GiB each (one,
    # one): 12 GiB; a buffer a layer would pin 1 GiB each
    assert placement.ram == 14 and item(memory, "14 decoder layers in pinned RAM") == 12 * 2**30
    left = room_for_layers(memory, 24, MIXTRAL_OTHERS, MIXTRAL_LAYER)  # 18 resident
    assert_cache_fills_the_room_left(memory, left, MIXTRAL_EXPERT, 8)
    assert_streams_by_expert(memory, MIXTRAL_HEAD, MIXTRAL_LAYER, 8, 2)
    assert_fits(memory, 24, 64)


def test_each_place_of_the_expert_cache_holds_the_largest_streamed_expert():
    """Experts may differ in size between layers (a GGUF stores some layers' in another quantization):
    the room left holds as many places as it has for the largest, so any expert routed fits one. The
    Mixtral plan above without its cache, its streamed layers' 8 units made 1/5 of that room in the
    first and 1/7 in the others: five places of the larger."""
    memory = plan("mixtral-8x7b-gptq", "mistral-7b", 24, 64)
    bare = replace(memory, items=tuple(entry for entry in memory.items if entry.what != EXPERT_CACHE),
                   placement=replace(memory.placement, expert_cache=0))
    room = memory.rooms.device - bare.total("device")
    first = memory.placement.streamed[0]

    def layout(index: int) -> LayerLayout:
        unit = room // 5 if index == first else room // 7
        return LayerLayout((), 8 * unit, tuple((expert * unit, (expert + 1) * unit) for expert in range(8)))

    cached = model.with_expert_cache(bare, [layout(index) for index in range(32)], torch.device("cuda"))
    assert cached.placement.expert_cache == 5 * (room // 5) == item(cached, "the most-routed experts")


def test_mixtral_on_a_16_gb_card_with_32_gb_of_ram_fits_without_its_nvme_disk():
    memory = plan("mixtral-8x7b-gptq", "mistral-7b", 16, 32)
    placement = memory.placement
    # the 32 - 7 = 25 layers streamed pin 1 GiB each: 26.8 GB, within 32 GB less the runtime and the OS
    assert placement.disk == 0 and placement.resident + placement.ram == 32
    assert placement.ram * 2**30 <= 32 * GB - RUNTIME_BYTES - OS_RESERVE
    assert placement.slot_bytes <= 0.85 * GB and memory.draft.quant == "nf4"  # bf16's 14.5 GB leaves no ring
    room_for_layers(memory, 16, MIXTRAL_OTHERS, MIXTRAL_LAYER)  # 7 resident
    assert_streams_by_expert(memory, MIXTRAL_HEAD, MIXTRAL_LAYER, 8, 2)
    assert_fits(memory, 16, 32)


@pytest.mark.parametrize("tokens", WIDTHS)
def test_mixtral_plans_a_pass_of_any_tree_width_streamed_by_expert(tokens):
    """At 1-1024 tree tokens: the pass's activations for that width, and its bytes: one token moves
    2 of 8 experts a layer, 16 tokens already ~7.9."""
    memory = plan("mixtral-8x7b-gptq", "mistral-7b", 16, 32, tree=tokens)
    assert memory.placement.streamed and memory.tree_tokens == tokens
    assert item(memory, "largest pass") == moe_pass(32, 8, 4096, 8, 2, 14336, tokens)
    assert_streams_by_expert(memory, MIXTRAL_HEAD, MIXTRAL_LAYER, 8, 2)


def test_qwen3_30b_a3b_gptq_and_qwen3_0_6b_on_an_8_gb_card_with_32_gb_of_ram():
    memory = plan("qwen3-30b-a3b-gptq", "qwen3-0.6b", 8, 32)
    assert memory.placement.layers == (QWEN3_30B_LAYER,) * 48 and 0.33 * GB < QWEN3_30B_LAYER < 0.34 * GB
    # the LM head, the final norm and the rotary tables on the card; the input embedding on the host
    assert item(memory, "fixed parts (") == 151936 * 2048 * BF16 + 2048 * BF16 + ROTARY_BYTES
    assert item(memory, "fixed parts:") == 151936 * 2048 * BF16
    tokens = CONTEXT + TREE
    assert item(memory, "target KV cache") == kv_per_token(48, 4) * tokens  # 96 KiB a token
    assert item(memory, "draft KV cache") == kv_per_token(28, 8) * tokens  # 112 KiB: the draft's is larger
    assert item(memory, "largest pass") == moe_pass(32, 4, 2048, 128, 8, 768, TREE)
    assert item(memory, "draft weights (nf4)") == QWEN3_0_6B_NF4
    assert item(memory, "quantized kernels' workspace") == QWEN3_30B_WORKSPACE
    placement = memory.placement
    assert placement.disk == 0 and placement.resident + placement.ram == 48
    # twelve 0.33 GB layers a 4 GiB buffer: 39 = 3 x 12 + 3, the three (0.99 GB) in 1 GiB: 13 GiB; a
    # buffer a layer would pin 512 MiB each
    assert placement.ram == 39 and item(memory, "39 decoder layers in pinned RAM") == 13 * 2**30
    caches = (kv_per_token(48, 4) + kv_per_token(28, 8)) * tokens
    others = (151936 * 2048 * BF16 + 2048 * BF16 + ROTARY_BYTES + caches
              + QWEN3_0_6B_NF4 + moe_pass(32, 4, 2048, 128, 8, 768, TREE) + QWEN3_30B_WORKSPACE + CUDA_MARGIN)
    room_for_layers(memory, 8, others, QWEN3_30B_LAYER)  # 9 resident
    assert_streams_by_expert(memory, QWEN3_30B_HEAD, QWEN3_30B_LAYER, 128, 8)
    assert_fits(memory, 8, 32)


def test_qwen3_235b_a22b_gptq_and_qwen3_1_7b_on_24_gb_and_96_gb_stream_the_rest_from_nvme():
    """With 128 GB every streamed layer fits in pinned RAM (84 in 112 GiB); with 96 the rest goes to disk."""
    memory = plan("qwen3-235b-a22b-gptq", "qwen3-1.7b", 24, 96)
    assert memory.placement.layers == (QWEN3_235B_LAYER,) * 94 and 1.32 * GB < QWEN3_235B_LAYER < 1.33 * GB
    # the LM head, the final norm and the rotary tables on the card; the input embedding on the host
    assert item(memory, "fixed parts (") == 151936 * 4096 * BF16 + 4096 * BF16 + ROTARY_BYTES
    assert item(memory, "fixed parts:") == 151936 * 4096 * BF16
    tokens = CONTEXT + TREE
    assert item(memory, "target KV cache") == kv_per_token(94, 4) * tokens
    assert item(memory, "largest pass") == moe_pass(64, 4, 4096, 128, 8, 1536, TREE)
    assert item(memory, "draft weights (nf4)") == QWEN3_1_7B_NF4
    assert item(memory, "quantized kernels' workspace") == QWEN3_235B_WORKSPACE
    placement, pinned = memory.placement, 2**31  # a 1.32 GB layer (and a staging buffer of one) pins 2 GiB
    assert placement.disk > 0 and placement.slots == 2
    assert item(memory, "2 pinned staging buffers") == 2 * pinned
    # three 1.32 GB layers a 4 GiB buffer: the RAM left after the runtime, the OS, the input
    # embedding and the staging holds 20 of them (85.9 GB of 87.96): 60 layers; 61 would need a
    # 2 GiB buffer more (a buffer a layer: 2 GiB each, 41 layers)
    embedding = 151936 * 4096 * BF16  # held on the host
    left = 96 * GB - RUNTIME_BYTES - OS_RESERVE - embedding - 2 * pinned
    assert 20 * 4 * 2**30 <= left < 20 * 4 * 2**30 + 2 * 2**30 and placement.ram == 60
    assert placement.resident + placement.ram + placement.disk == 94
    caches = (kv_per_token(94, 4) + kv_per_token(28, 8)) * tokens
    others = (151936 * 4096 * BF16 + 4096 * BF16 + ROTARY_BYTES + caches
              + QWEN3_1_7B_NF4 + moe_pass(64, 4, 4096, 128, 8, 1536, TREE) + QWEN3_235B_WORKSPACE + CUDA_MARGIN)
    left = room_for_layers(memory, 24, others, QWEN3_235B_LAYER)  # 10 resident
    assert_cache_fills_the_room_left(memory, left, experts(1, 4096, 1536, 128, False), 128)
    assert_streams_by_expert(memory, QWEN3_235B_HEAD, QWEN3_235B_LAYER, 128, 8)
    assert_fits(memory, 24, 96)


def test_doctor_plans_the_papers_moe_pair_at_4_bits_and_prints_its_expected_speed(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the plan comes from the shipped configs
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "mixtral-8x7b-gptq", "--draft", "mistral-7b",
                           "--vram-gb", "24", "--ram-gb", "64", "--pcie-gbps", "25", "--disk-gbps", "3")
    assert code == 0
    layers = re.search(r"^  layers         (\d+) resident, (\d+) in RAM, (\d+) on disk$", out, re.M)
    assert layers and int(layers.group(1)) + int(layers.group(2)) + int(layers.group(3)) == 32
    streamed = int(layers.group(2)) + int(layers.group(3))
    assert f"  ring           2 slots of {MIXTRAL_LAYER / 1e9:.2f} GB" in out  # 0.75 GB: 4-bit experts
    assert f"  per pass       {streamed * MIXTRAL_LAYER / 1e9:.2f} GB streamed; ~" in out
    # the paper's Mixtral gen rate over a 257-token tree's pass: every expert routed to, from RAM at 25 GB/s
    assert layers.group(3) == "0"
    expected = 12.38 / (streamed * MIXTRAL_LAYER / 25e9)
    assert f"  expected       at most {expected:.1f} tokens/s: 12.38 tokens per pass " \
           "(SpecExec's Mixtral-8x7B gen rate at a 256-token budget)" in out
    # 8 experts, 2 a token: 8(1 - (3/4)^n) a layer at 1, 16, 64 and 1024 tree tokens, and their bytes
    assert "  experts        2 of 8 a token; a pass over n tree tokens routes to ~(1: 2.0, 16: 7.9, 64: 8.0, " \
           "1024: 8.0) of them a layer" in out
    head, routed = aligned(MIXTRAL_HEAD), MIXTRAL_LAYER - aligned(MIXTRAL_HEAD)
    widths = ", ".join(f"{n}: {streamed * (head + (1 - 0.75 ** n) * routed) / 1e9:.2f}" for n in WIDTHS)
    assert f"  by expert      a streamed layer moves its head and the experts routed to: ~({widths}) GB a pass" in out


def test_doctor_says_nothing_of_experts_for_a_dense_target(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-2-70b-gptq", "--draft", "llama-2-7b",
                           "--vram-gb", "24", "--ram-gb", "64")
    assert code == 0 and "  layers " in out and "experts " not in out
