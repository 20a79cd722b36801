"""The paper's pairs planned on virtual machines, from the shipped configs alone. Every byte count
asserted here is the configs' arithmetic written out (here and in tests/helpers/plan_sizes.py),
not the plan's own output."""

from dataclasses import replace

import pytest
import torch
from helpers.plan_sizes import (BF16, DRAFT_LINEAR_WEIGHTS, DRAFT_PREPARING, FP32, GB, NOWHERE, ROTARY_BYTES,
                                TARGET_LAYER, TARGET_SLOT, TREE, assert_fits, gpu_plan, int4_linear, int8_draft, item,
                                kv_per_token, llama_layer_linears, math_pass, pair_on_a_cpu)
from helpers.tiny import tiny_qwen_config
from torch import nn
from transformers import Qwen2ForCausalLM

from specchat.errors import PlanRefusal, SpecchatError
from specchat.offload.direct_io import ALIGN
from specchat.plan import model
from specchat.plan.budget import CUDA_MARGIN, OS_RESERVE
from specchat.plan.machine import RUNTIME_BYTES, Machine, described_rooms
from specchat.plan.model import plan_measured
from specchat.plan.pair import contexts_for, draft_candidates, measure_pair, plan_pair
from specchat.plan.request import Pair, PlanRequest
from specchat.quant.q6k_linear import Q6Linear

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def narrow_cpu(monkeypatch) -> None:
    """A CPU whose dense bf16 products stay bf16 (quant/widened.py): the byte counts here have no
    kernel's workspace; the widened products' is counted in its own test."""
    monkeypatch.setattr(model, "widened_rows", lambda dtype: None)


LLAMA2_70B_GPTQ_LAYER = sum(int4_linear(i, o, -1, True) for i, o in llama_layer_linears(8192, 28672, 8)) + \
    2 * 8192 * BF16
LAYER_BYTES = {"llama-2-70b-gptq": LLAMA2_70B_GPTQ_LAYER,  # group -1, act-order
               "llama-3.1-70b-gptq": sum(int4_linear(i, o, 128, True) for i, o in llama_layer_linears(8192, 28672, 8))
               + 2 * 8192 * BF16}  # group 128, act-order
LLAMA2_7B_PARAMS_LINEAR = 32 * sum(i * o for i, o in llama_layer_linears(4096, 11008, 32))
LLAMA2_7B_OTHER = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096  # embeddings, head, norms
LLAMA2_7B_EMBEDDING = 32000 * 4096  # its input embedding: held on the host beside a GPU


def default_pair(kinds: tuple[str, ...] = ("int8",), dense_above: int | None = None, vocab: int | None = 32768,
                 context: int | None = None) -> Pair:
    """The embedded pair, its target dense (its sizes from the config), the draft in `kinds`."""
    return Pair("qwen2.5-coder-1.5b", torch.bfloat16, draft="qwen2.5-coder-0.5b", draft_kinds=kinds,
                dense_above=dense_above, draft_vocab=vocab, context=context)


def cpu_plan(pair: Pair, request: PlanRequest, rooms):
    return plan_pair(pair, request, Machine(rooms=rooms))


def test_llama_2_70b_gptq_and_7b_on_a_24_gb_card_with_64_gb_of_ram():
    memory = gpu_plan("llama-2-70b-gptq", "llama-2-7b", 24, 64)
    placement = memory.placement
    assert placement.layers == (LLAMA2_70B_GPTQ_LAYER,) * 80
    # the LM head, the final norm and the rotary tables on the card; the input embedding on the host
    assert item(memory, "fixed parts (") == 32000 * 8192 * BF16 + 8192 * BF16 + ROTARY_BYTES
    assert item(memory, "fixed parts:") == 32000 * 8192 * BF16 and memory.embedding_on_host
    tokens = 4096 + TREE
    assert item(memory, "target KV cache") == kv_per_token(80, 8) * tokens == 327680 * tokens  # 320 KiB a token
    assert item(memory, "draft KV cache") == kv_per_token(32, 32) * tokens == 524288 * tokens  # 512 KiB: more
    nf4 = LLAMA2_7B_OTHER * BF16 + ROTARY_BYTES + sum(int(w * (0.5 + 4 / 64)) for w in [i * o for i, o in llama_layer_linears(
        4096, 11008, 32)] * 32)
    assert memory.draft.quant == "nf4" and item(memory, "draft weights (") == nf4  # bf16's 13.5 GB leaves few residents
    assert item(memory, "CUDA context") == CUDA_MARGIN
    assert item(memory, "kept for the OS") == OS_RESERVE
    # the int4 path's largest temporary at the tree's rows (quant/int4.py's bound, measured there): the
    # down projection's (28672 -> 8192) permuted bf16 input, and its chunked float32 product's buffers:
    # 64 output rows a chunk (2**20 weights at most, whole 64-row tiles), two nibble planes and the
    # float32 chunk (6 bytes a weight), float32 scales and zeros per group of 256, the input widened
    # to float32 and a float32 chunk of output. (Its bf16 product and CUDA's expansion take less.)
    chunk = 64 * 28672
    down = TREE * 28672 * BF16 + 6 * chunk + 2 * FP32 * 64 * (28672 // 256) + TREE * (28672 + 64) * FP32
    assert item(memory, "quantized kernels' workspace") == down == 364_085_504
    # a pass over the tree (2049 tokens after 4096), its 64 query heads packed as rows of 8 KV heads:
    # on the math path the KV heads' keys and values in float32 (2 x 8 x 6145 x 128 x 4 bytes = 50 MB),
    # a call's scores, 68 rows of 64 x 6145 (256 MiB hold 68.3, 10 bytes each: 267 MB) and its mask
    # repeated for 8 query heads and widened (20 MB); the MLP's products, the masks, hidden states
    assert item(memory, "largest pass") == math_pass(64, 8, 128, 8192, 28672, 4096, TREE) == 887_559_877
    # pinned in 4 GiB buffers of nine 442 MB layers: 56 = 6 x 9 + 2, the two in 1 GiB, 25 GiB in all;
    # a buffer a layer would pin 512 MiB each, 28 GiB
    assert placement.ram == 56 and item(memory, "56 decoder layers in pinned RAM") == (6 * 4 + 1) * 2**30
    assert placement.resident + placement.ram == 80 and placement.disk == 0 and placement.resident >= 20
    assert item(memory, f"{placement.resident} resident") == placement.resident * LLAMA2_70B_GPTQ_LAYER
    assert_fits(memory, 24, 64)
    assert memory.context == 4096 and memory.notes  # auto says why the draft is in nf4


def test_without_bitsandbytes_the_7b_draft_is_rounded_to_4_bits_and_loads_on_the_card():
    """On a card without bitsandbytes `auto` weighs full weights against int4: the bf16 draft does
    not fit beside the smallest ring; the rounded one loads a layer at a time straight onto the card
    (nothing of it in RAM), its layer in preparation counted there."""
    memory = gpu_plan("llama-2-70b-gptq", "llama-2-7b", 24, 64, kinds=("none", "int4"))
    linears = llama_layer_linears(4096, 11008, 32)
    rounded = 32 * sum(i * o // 2 + i // 128 * o * 2 * BF16 for i, o in linears)  # nibbles, bf16 scale and zero a group
    assert memory.draft.quant == "int4"
    on_card = LLAMA2_7B_OTHER - LLAMA2_7B_EMBEDDING
    assert item(memory, "draft weights (int4)") == rounded + on_card * BF16 + ROTARY_BYTES  # 3.70 GB
    assert item(memory, "the draft's input embedding, looked up on the host") == LLAMA2_7B_EMBEDDING * BF16
    # one layer's bf16 weights, the down projection's nibbles beside their packed copy, three float32
    # blocks of 256 rows of its 11008 inputs
    preparing = sum(i * o for i, o in linears) * BF16 + 11008 * 4096 // 2 + 3 * 256 * 11008 * FP32
    assert item(memory, "the draft's layer while it turns int4") == preparing
    assert not any(entry.what == "draft weights while they load" for entry in memory.items)
    assert memory.placement.resident == 24 and memory.placement.disk == 0
    assert_fits(memory, 24, 64)


def test_the_bf16_draft_alone_is_planned_when_it_is_the_only_choice():
    memory = gpu_plan("llama-2-70b-gptq", "llama-2-7b", 24, 64, kinds=("none",))
    on_card = LLAMA2_7B_PARAMS_LINEAR + LLAMA2_7B_OTHER - LLAMA2_7B_EMBEDDING
    assert item(memory, "draft weights (") == on_card * BF16 + ROTARY_BYTES  # 13.2 GB
    assert memory.placement.resident < 10
    assert_fits(memory, 24, 64)


def test_llama_3_1_70b_at_8192_tokens_and_its_8b_on_24_gb_and_64_gb():
    memory = gpu_plan("llama-3.1-70b-gptq", "llama-3.1-8b", 24, 64, context=8192)
    tokens = 8192 + TREE
    assert item(memory, "target KV cache") == kv_per_token(80, 8) * tokens
    assert item(memory, "draft KV cache") == kv_per_token(32, 8) * tokens  # 128 KiB a token
    layer = LAYER_BYTES["llama-3.1-70b-gptq"]
    assert memory.placement.layers == (layer,) * 80
    assert memory.context == 8192 and memory.placement.disk == 0
    assert_fits(memory, 24, 64)


@pytest.mark.parametrize(("target", "draft"), [("llama-2-70b-gptq", "llama-2-7b"),
                                               ("llama-3.1-70b-gptq", "llama-3.1-8b")])
def test_a_16_gb_card_with_32_gb_of_ram_streams_the_rest_from_nvme(target, draft):
    memory = gpu_plan(target, draft, 16, 32)
    placement = memory.placement
    assert placement.disk > 0 and placement.slots >= 2
    layer = LAYER_BYTES[target]
    assert placement.layers == (layer,) * 80 and placement.slot_bytes == -(-layer // ALIGN) * ALIGN
    assert 2**28 < placement.slot_bytes <= 2**29  # a ~0.45 GB layer: each staging buffer pins 512 MiB
    assert item(memory, f"{placement.slots} pinned staging") == placement.slots * 2**29
    assert_fits(memory, 16, 32)


def test_qwen2_5_72b_on_12_gb_fits_alone_and_is_refused_in_one_line_beside_a_7b():
    alone = gpu_plan("qwen2.5-72b-gptq", None, 12, 32)
    fixed = 152064 * 8192 * BF16 + 8192 * BF16 + ROTARY_BYTES  # an untied head (2.5 GB of the 12), the norm
    assert item(alone, "fixed parts (") == fixed and alone.placement.disk > 0
    assert item(alone, "fixed parts:") == 152064 * 8192 * BF16  # the input embedding, on the host
    assert_fits(alone, 12, 32)
    with pytest.raises(SpecchatError) as refused:
        gpu_plan("qwen2.5-72b-gptq", "qwen2.5-7b", 12, 32)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("GPU memory (12.00 GB) is ") and " short: " in message
    assert "a smaller draft would fit" in message


def test_auto_halves_a_default_context_that_does_not_fit_and_says_so():
    roomy = gpu_plan("llama-2-70b-gptq", "llama-2-7b", 24, 64)
    kv = kv_per_token(80, 8) + kv_per_token(32, 32)
    # a card 2048 tokens of both caches short of the default context (and of the ring's slack)
    vram = (roomy.total("device") - item(roomy, f"{roomy.placement.resident} resident")
            - kv * 2048 + 2 * LLAMA2_70B_GPTQ_LAYER) / GB
    memory = gpu_plan("llama-2-70b-gptq", "llama-2-7b", vram, 64, kinds=("nf4",))
    assert memory.context == 2048 and "context 2048 tokens: 4096 does not fit" in memory.notes


def test_a_context_the_user_fixed_is_not_shrunk_and_the_refusal_names_one_that_fits():
    with pytest.raises(SpecchatError, match=r"--context \d+ would fit$"):
        gpu_plan("llama-2-70b-gptq", "llama-2-7b", 22, 64, context=4096, kinds=("none",))


def test_contexts_default_to_4096_and_halve_to_1024_and_a_past_maximum_context_is_one_line():
    assert contexts_for(None, 131072) == (4096, 2048, 1024)
    assert contexts_for(None, 2048) == (2048, 1024)
    assert contexts_for(None, 3001) == (3001, 1500)  # an odd maximum halves to whole tokens
    assert contexts_for(8192, 131072) == (8192,)
    with pytest.raises(SpecchatError, match=r"^--context 8192 is past the target's maximum of 4096 tokens$"):
        contexts_for(8192, 4096)


def test_the_default_pairs_caches_and_largest_pass_on_a_cpu_follow_the_configs():
    memory = cpu_plan(default_pair(("none",), vocab=None), PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=1025),
                      described_rooms(None, 24 * GB))
    tokens = 4096 + 1025
    assert item(memory, "target KV cache") == 28 * 2 * 2 * 128 * BF16 * tokens  # 28 KiB a token (2 KV heads)
    assert item(memory, "draft KV cache") == 24 * 2 * 2 * 64 * BF16 * tokens  # 12 KiB a token
    target_pass = math_pass(12, 2, 128, 1536, 8960, 4096, 1025)
    assert item(memory, "largest pass") == max(target_pass, math_pass(14, 2, 64, 896, 4864, 4096, 1025)) == target_pass
    embedding = head = 151936 * 896  # untied: the 0.5B's GGUF stores its LM head (output.weight, Q8_0)
    draft_params = embedding + head + 24 * (2 * 896 + 896 * 896 * 2 + 896 * 128 * 2 + 896 * 4864 * 3) + 896
    biases = 24 * (896 + 128 + 128)  # Qwen2's q/k/v biases
    assert item(memory, "draft weights (") == (draft_params + biases) * BF16 + 2 * 32 * FP32  # + rotary buffers
    assert memory.placement.resident == 28 and not memory.placement.streamed
    assert memory.total("device") <= 24 * GB - RUNTIME_BYTES - OS_RESERVE
    assert memory.target_bytes() == item(memory, "fixed parts") + item(memory, "28 resident decoder layers")


def test_an_int8_draft_on_a_cpu_counts_the_layer_it_prepares_as_it_loads():
    """The draft loads one decoder layer at a time and turns it int8 (models/layerwise.py): above its
    int8 weights it holds one layer's dense weights, the stacked copy of gate and up, that stack's
    int8 rows twice (quantized, then packed) and three float32 temporaries of 256 rows of the
    widest input (down's 4864); the plan keeps that room (a ring placed before the draft loads
    leaves it), and nothing for a dense draft."""
    dense, int8 = draft_candidates(default_pair(("none", "int8")), CPU)
    rooms = described_rooms(None, 24 * GB)
    for kind, draft in (("none", dense), ("int8", int8)):
        memory = cpu_plan(default_pair((kind,)), PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=1025), rooms)
        excess = [entry.nbytes for entry in memory.items if entry.what.startswith("the draft's layer while")]
        assert memory.draft == draft and excess == ([DRAFT_PREPARING] if draft is int8 else [])
    assert int8.prepare_bytes == DRAFT_PREPARING and dense.prepare_bytes == 0


def test_auto_shrinks_the_largest_tree_before_the_context_and_says_so():
    """Where the default pair's smallest ring does not fit beside a 1024-token tree's pass, auto
    takes the first smaller tree (auto's halves) that fits, keeping the default context."""
    def plan(rooms, tree: int, smaller: tuple[int, ...] = ()):
        ask = PlanRequest(tier="disk", offload_dir=NOWHERE, resident_layers=0, slots=2, tree_tokens=tree,
                          smaller_trees=smaller)
        return cpu_plan(default_pair(), ask, rooms)

    ample = described_rooms(None, 24 * GB)
    need = {tree: pair_on_a_cpu(4096, tree, int8_draft(32768), 2 * TARGET_SLOT) for tree in (1025, 513, 257, 129)}
    assert {tree: plan(ample, tree).total("device") for tree in need} == need
    room = (need[513] + need[257]) // 2  # a 256-token tree fits, a 512-token one does not
    rooms = replace(ample, device=room)
    memory = plan(rooms, 1025, (513, 257, 129))
    assert memory.tree_tokens == 257 and memory.context == 4096
    assert "trees of at most 256 tokens: 1024 do not fit" in memory.notes
    assert plan(rooms, 1025).context < 4096  # without smaller trees, the context gives way


def test_an_int8_draft_gives_up_its_dense_copies_before_the_plan_refuses():
    """Where `auto` measured that the int8 draft's wide steps run faster on dense copies kept beside
    its int8 weights (an avx512_bf16 or AMX CPU), the copies are a form of the draft the plan weighs
    like another quantization: kept where RAM holds them, dropped (int8 at every width) where only
    that fits, and the refusal, where neither does, weighs the int8-only form."""
    kept, alone = draft_candidates(default_pair(dense_above=16), CPU)
    assert (kept.quant, kept.dense_above, alone.quant, alone.dense_above) == ("int8", 16, "int8", None)
    assert (kept.weights, alone.weights) == (int8_draft(32768, dense_copies=True), int8_draft(32768))

    def plan(room: int):
        ask = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=1025)
        return cpu_plan(default_pair(dense_above=16, context=4096), ask, replace(ample, device=room))

    ample = described_rooms(None, 24 * GB)
    need = pair_on_a_cpu(4096, 1025, int8_draft(32768, dense_copies=True), 28 * TARGET_LAYER)
    roomy = plan(ample.device)
    assert roomy.draft == kept and roomy.total("device") == need
    copies = DRAFT_LINEAR_WEIGHTS * BF16
    tight = plan(need - copies // 2)  # the copies' half is missing: only the int8-only form keeps every layer
    assert tight.draft == alone and not tight.placement.streamed
    assert tight.total("device") == need - copies
    assert any(note.startswith("draft in int8: ") for note in tight.notes)


def test_a_cpu_that_widens_bf16_counts_the_largest_widened_products_buffers(monkeypatch):
    """Where dense bf16 products run widened to float32, the largest one's buffers at the tree's
    rows: the down projection's (8960 inputs, 117 output rows a chunk of 2**20 weights) widened
    input, float32 chunk and chunk of output."""
    ask = PlanRequest(tier="none", offload_dir=NOWHERE, tree_tokens=1025)
    ample = described_rooms(None, 24 * GB)
    narrow = cpu_plan(default_pair(context=4096), ask, ample).total("device")
    monkeypatch.setattr(model, "widened_rows", lambda dtype: 8)
    widened = cpu_plan(default_pair(context=4096), ask, ample).total("device")
    assert widened - narrow == FP32 * (1025 * 8960 + 117 * 8960 + 1025 * 117)


def test_a_refusal_carries_its_room_the_bytes_missing_and_the_option_that_would_fit():
    """Every layer asked on the device, in a room 1000 bytes smaller than the plan that fits needs:
    the refusal names the device, exactly those bytes, and a shorter context that fits; doctor and
    auto catch its type, never read the message's words."""
    ask = PlanRequest(tier="none", offload_dir=NOWHERE, tree_tokens=1025)
    pair = default_pair(context=4096)
    ample = described_rooms(None, 24 * GB)
    need = pair_on_a_cpu(4096, 1025, int8_draft(32768), 28 * TARGET_LAYER)
    assert cpu_plan(pair, ask, ample).total("device") == need
    with pytest.raises(PlanRefusal) as refused:
        cpu_plan(pair, ask, replace(ample, device=need - 1000))
    assert (refused.value.tier, refused.value.missing) == ("device", 1000)
    assert refused.value.fits.startswith("--context ") and str(refused.value).endswith(refused.value.fits)
    with pytest.raises(SpecchatError) as bad_option:  # a bad option is no refusal, whatever its words
        cpu_plan(pair, replace(ask, tier="auto", resident_layers=99), ample)
    assert not isinstance(bad_option.value, PlanRefusal)


def test_a_measurement_is_planned_only_on_its_own_kind_of_device():
    """plan_pair in two steps: what is measured for a GPU (its kernels' layouts, no dense copies)
    is no CPU's plan, so planning it on a CPU machine is refused instead of silently made."""
    request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE)
    measured = measure_pair(Pair("llama-2-70b-gptq", torch.bfloat16, context=4096), request, torch.device("cuda"))
    assert plan_measured(measured, Machine(vram_gb=80, ram_gb=256)).placement is not None
    with pytest.raises(ValueError, match="measured for cuda planned on a cpu machine"):
        plan_measured(measured, Machine(ram_gb=256))


def test_q6_linears_count_their_chunk_product_and_widened_their_float32_input(monkeypatch):
    """A tiny Qwen2 whose every linear is Q6_K (hidden 64, MLP 128, vocab 256; each chunk a whole
    small weight): 100 rows add, beside the largest chunk buffers (down's and gate's, 64 x 128
    weights in float32 and bf16 and their scales: 51200 bytes), the widest chunk's product in bf16
    (gate's 128 columns: 25600; the head's 256 where it may stay Q6_K: 51200), or widened a
    linear's float32 input and product, 4 x 100 x (in + out): 76800 for down, 128000 for the head."""
    config = tiny_qwen_config(vocab_size=256, hidden_size=64, intermediate_size=128, tie_word_embeddings=False)
    with torch.device("meta"):
        tiny = Qwen2ForCausalLM(config)
        for name, linear in [(n, m) for n, m in tiny.named_modules() if isinstance(m, nn.Linear)]:
            tiny.set_submodule(name, Q6Linear(linear.in_features, linear.out_features, False, torch.bfloat16))
    cuda = torch.device("cuda")
    assert model.quantized_workspaces(tiny, torch.bfloat16, CPU)(100) == 51200 + 25600
    monkeypatch.setattr(model, "widened_rows", lambda dtype: 8)
    assert model.quantized_workspaces(tiny, torch.bfloat16, CPU)(100) == 51200 + 76800
    assert model.quantized_workspaces(tiny, torch.bfloat16, CPU, compact_head=True)(100) == 51200 + 128000
    assert model.quantized_workspaces(tiny, torch.bfloat16, cuda)(100) == 51200 + 25600
    assert model.quantized_workspaces(tiny, torch.bfloat16, cuda, compact_head=True)(100) == 51200 + 51200


def test_a_cpu_target_keeps_dense_copies_where_asked_and_every_layer_leaves_room_and_a_gpus_never(monkeypatch):
    """The 4-bit target's dense copies for tree passes (quant/int4_dense.py; their bytes here a stand-in:
    which shapes gain is this CPU's measured choice) are weighed for a CPU whose request asks, and kept
    only where every layer is in memory and the room left holds them all; a GPU's measurement has none."""
    copies = 10 * GB
    monkeypatch.setattr(model, "dense_copy_bytes", lambda skeleton: copies)
    pair = Pair("llama-2-70b-gptq", torch.bfloat16, context=4096)
    plain = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=TREE)
    measured = measure_pair(pair, replace(plain, dense_copies=True), CPU)
    assert measured.dense_copies == copies
    assert measure_pair(pair, plain, CPU).dense_copies == 0
    assert measure_pair(pair, replace(plain, dense_copies=True), torch.device("cuda")).dense_copies == 0
    ample = described_rooms(None, 256 * GB)
    without = plan_measured(measure_pair(pair, plain, CPU), Machine(rooms=ample))
    need = without.total("device")
    assert without.dense_copies == 0 and not without.placement.streamed

    def kept(room: int) -> int:
        return plan_measured(measured, Machine(rooms=replace(ample, device=room))).dense_copies

    assert (kept(ample.device), kept(need + copies), kept(need + copies - 1)) == (copies, copies, 0)


def test_a_plan_made_without_a_conversation_count_keeps_one_conversations_caches():
    """`plan_measured` called directly (plan_checkpoint's, doctor's bisection) with the count left to
    auto (serve's `--slots auto`) plans one conversation, as auto's first plan does (plan/conversations.py)."""
    request = PlanRequest(tier="auto", offload_dir=NOWHERE, tree_tokens=1025, conversations=None)
    memory = plan_measured(measure_pair(default_pair(("none",), vocab=None), request, CPU),
                           Machine(rooms=described_rooms(None, 24 * GB)))
    assert memory.conversations == 1
    assert item(memory, "target KV cache (") == 28 * 2 * 2 * 128 * BF16 * (4096 + 1025)  # one cache, as above
