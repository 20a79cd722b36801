"""The memory plan's arithmetic (plan/budget.py) on small made-up models, its sums written out here
(a pass's and a cache's bytes are plan/demand.py's, tested beside it): the forms a target may take,
the device's check before placement, the host's room, and what a refusal offers instead."""

from dataclasses import replace

import pytest

from specchat.errors import PlanRefusal
from specchat.offload.direct_io import ALIGN
from specchat.plan.budget import OS_RESERVE, SMALLEST_CONTEXT, Ask, Target, plan_memory
from specchat.plan.demand import ModelShape
from specchat.plan.draft_form import Draft
from specchat.plan.placement import ModelSizes, Request, Rooms
from specchat.transfer import gb

SHAPE = ModelShape(heads=2, kv_heads=1, head_dim=4, hidden=8, intermediate=16, kv_per_token=64, itemsize=2)
LAYER, COMPACT_LAYER = 3 * ALIGN, 2 * ALIGN  # slot-aligned: a ring slot is exactly a layer
FIXED = 10_000
ASK = Ask(contexts=(64,), drafts=(None,), tree_tokens=8, workspace=0)
TOKENS = 64 + 8  # the context and the largest tree
PASS = SHAPE.pass_bytes(64, 8)


def sizes(layer: int, fixed: int = FIXED) -> ModelSizes:
    return ModelSizes(layers=(layer,) * 4, fixed=fixed, headroom=0, file_bytes=4 * layer)


PLAIN = Target(sizes(LAYER), SHAPE)


def draft_of(weights: int, quant: str = "none") -> Draft:
    return Draft(quant, weights, SHAPE, load_bytes=0)


def cpu(device: int) -> Rooms:
    return Rooms(device=device, host=None, disk=10**12)


def test_an_input_embedding_held_on_the_host_comes_out_of_every_forms_fixed_parts():
    """Beside a GPU the target's input embedding (here 2000 bytes) lives on the host: its dense and
    its Q6_K head's fixed parts both lose it, each layer form keeps the one it is taken from."""
    target = Target(sizes(LAYER), SHAPE, compact_fixed=6_000, compact_layers=sizes(COMPACT_LAYER, fixed=0))
    assert target.embedding_on_host(0) is target
    hosted = target.embedding_on_host(2_000)
    assert hosted.host_embedding == 2_000
    forms = [(form.sizes.fixed, compact) for form, compact in hosted.forms()]
    assert forms == [(FIXED - 2_000, False), (6_000 - 2_000, True)]
    layered = [(form.sizes.fixed, form.sizes.layers, compact) for form, compact in hosted.layer_forms()]
    assert layered == [(FIXED - 2_000, (LAYER,) * 4, False), (FIXED - 2_000, (COMPACT_LAYER,) * 4, True)]


def test_the_compact_layers_are_planned_and_flagged_where_they_stream_less():
    """A CPU room that holds the fixed parts, the cache, the pass and the four compact layers (8
    units of 4 KiB) but not the four dense ones (12): the dense form would stream every layer
    through a ring of two slots, the compact one streams nothing and is chosen, and the plan says
    so; with room for every dense layer the dense form, the first on a tie, stays."""
    target = Target(sizes(LAYER), SHAPE, compact_layers=sizes(COMPACT_LAYER))
    around = FIXED + SHAPE.kv_bytes(TOKENS) + PASS
    tight = plan_memory(target, ASK, cpu(around + 4 * COMPACT_LAYER))
    assert tight.compact_layers and tight.placement.layers == (COMPACT_LAYER,) * 4 and tight.placement.resident == 4
    roomy = plan_memory(target, ASK, cpu(around + 4 * LAYER))
    assert not roomy.compact_layers and roomy.placement.layers == (LAYER,) * 4 and roomy.placement.resident == 4


def test_the_device_must_hold_the_smallest_ring_of_the_largest_layer():
    """Layers of unequal sizes: the smallest ring is two slots of the largest, whatever the others
    weigh; a room a byte short of it is refused with exactly that byte missing, and the line names
    the ring and the four largest of the six items beside it (draft 50,000, pass 24,896, fixed
    10,000, the target's cache 4,608 bytes), not the draft's cache or the workspace."""
    uneven = ModelSizes(layers=(LAYER, 5 * ALIGN, LAYER, LAYER), fixed=FIXED, headroom=0, file_bytes=12 * ALIGN)
    target = Target(uneven, SHAPE)
    draft = draft_of(50_000)
    ask = Ask(contexts=(64,), drafts=(draft,), tree_tokens=8, workspace=3_000)
    need = FIXED + 2 * SHAPE.kv_bytes(TOKENS) + 50_000 + PASS + 3_000 + 2 * 5 * ALIGN
    assert plan_memory(target, ask, cpu(need)).placement.slots == 2
    with pytest.raises(PlanRefusal) as refused:
        plan_memory(target, ask, cpu(need - 1))
    assert (refused.value.tier, refused.value.missing) == ("device", 1)
    reason = refused.value.reason
    assert "for the smallest streaming ring beside draft weights (none)" in reason
    assert all(name in reason for name in ("largest pass", "fixed parts", "target KV cache"))
    assert "draft KV cache" not in reason and "workspace" not in reason


def test_resident_layers_asked_are_counted_in_the_devices_check():
    """--resident-layers 3 of four equal 1.2 GB layers: the device needs the three and a ring of two
    beside the rest; 0.6 GB less is refused in a line naming that shortfall and the three layers."""
    layer = 300_000 * ALIGN
    target = Target(sizes(layer), SHAPE)
    ask = Ask(contexts=(64,), drafts=(None,), tree_tokens=8, workspace=0, request=Request(resident_layers=3))
    need = FIXED + SHAPE.kv_bytes(TOKENS) + PASS + 3 * layer + 2 * layer
    assert plan_memory(target, ask, cpu(need)).placement.resident == 3
    with pytest.raises(PlanRefusal) as refused:
        plan_memory(target, ask, cpu(need - 600_000_000))
    assert refused.value.missing == 600_000_000
    assert refused.value.reason.startswith(f"RAM is 0.60 GB short: {gb(need)} are needed for 3 resident layers beside")


def test_the_plan_says_which_input_embeddings_it_holds_on_the_host():
    """The target's (out of its fixed parts) and the draft's (out of its weights) each on the host
    only where the plan holds it there."""
    draft = draft_of(50_000)
    room = cpu(10**8)
    for target, drafts, expected in ((PLAIN, (None,), (False, False)), (PLAIN, (draft,), (False, False)),
                                     (PLAIN.embedding_on_host(2_000), (draft,), (True, False)),
                                     (PLAIN, (replace(draft, host_embedding=3_000),), (False, True))):
        memory = plan_memory(target, replace(ASK, drafts=drafts), room)
        assert (memory.embedding_on_host, memory.draft_embedding_on_host) == expected


def test_beside_a_gpu_the_host_must_hold_what_loading_and_the_os_need():
    """A GPU's plan keeps OS_RESERVE of RAM for the OS, and the target's input embedding there: a
    host room of exactly both plans (every layer resident, nothing left to pin), a byte less is
    refused on the host with that byte missing."""
    target = PLAIN.embedding_on_host(2_000)
    ask = replace(ASK, cuda=True)
    host = OS_RESERVE + 2_000
    memory = plan_memory(target, ask, Rooms(device=10**10, host=host, disk=10**9))
    assert memory.total("host") == host and memory.placement.resident == 4
    with pytest.raises(PlanRefusal) as refused:
        plan_memory(target, ask, Rooms(device=10**10, host=host - 1, disk=10**9))
    assert (refused.value.tier, refused.value.missing) == ("host", 1)


def need_streaming(context: int, draft: Draft | None) -> int:
    """The device's bytes at `context` for the made-up target streaming its layers from the disk:
    fixed parts, the caches, the largest pass and the draft's weights, and the ring of two slots."""
    tokens = context + 8
    caches = SHAPE.kv_bytes(tokens) * (1 if draft is None else 2)
    weights = 0 if draft is None else draft.weights
    return FIXED + caches + SHAPE.pass_bytes(context, 8) + weights + 2 * LAYER


@pytest.mark.parametrize("fitting", [1000, SMALLEST_CONTEXT // 4])
def test_a_refusal_names_the_largest_context_at_which_the_smallest_draft_fits(fitting):
    """Two draft forms that fit at no default context: the refusal is the smaller's (its bytes
    missing at 4096 tokens) and names the largest context it fits at, found by the plan's search:
    a room of exactly its need at 1000 tokens gives --context 1000, and so down to a quarter of
    1024; a token's bytes less names the context below, or none at that floor."""
    small, large = draft_of(40_000, "int8"), draft_of(200_000)
    ask = Ask(contexts=(4096,), drafts=(large, small), tree_tokens=8, workspace=0)
    room = need_streaming(fitting, small)
    with pytest.raises(PlanRefusal) as refused:
        plan_memory(PLAIN, ask, cpu(room))
    assert refused.value.missing == need_streaming(4096, small) - room
    assert refused.value.fits == f"--context {fitting} with the draft in int8 would fit"
    alone = replace(ask, drafts=(small,))  # the form the user fixed is not named
    with pytest.raises(PlanRefusal, match=f"; --context {fitting} would fit$"):
        plan_memory(PLAIN, alone, cpu(room))
    with pytest.raises(PlanRefusal) as shorter:
        plan_memory(PLAIN, ask, cpu(need_streaming(fitting - 1, small)))
    assert shorter.value.fits == (f"--context {fitting - 1} with the draft in int8 would fit"
                                  if fitting > SMALLEST_CONTEXT // 4 else None)


def test_where_no_context_fits_the_draft_the_refusal_offers_none():
    """A draft whose weights alone are twice the target's whole plan at 8192 tokens: no context of
    a quarter of 1024 or more fits it, and without it the target would run at the smallest
    context auto would take (4096, after 8192)."""
    heavy = draft_of(2 * need_streaming(8192, None))
    ask = Ask(contexts=(8192, 4096), drafts=(heavy,), tree_tokens=8, workspace=0)
    with pytest.raises(PlanRefusal) as refused:
        plan_memory(PLAIN, ask, cpu(need_streaming(4096, None)))
    assert refused.value.fits == "a smaller draft would fit, or none (--engine autoregressive)"
    with pytest.raises(PlanRefusal) as nothing:  # a room that holds not even the target: no option is named
        plan_memory(PLAIN, ask, cpu(need_streaming(4096, None) - 1))
    assert nothing.value.fits is None


def test_a_refusals_fitting_context_is_the_smallest_forms_at_the_smallest_tree():
    """A target whose LM head also comes in Q6_K (1,000 bytes of fixed parts less) and its layers
    too (a smaller ring), and auto's smaller tree of 4 tokens with no kernels' workspace (the 8
    tokens' is 5,000 bytes): the context the refusal names is where the compact forms fit with that
    tree, a room of exactly their need at 700 tokens."""
    target = Target(sizes(LAYER), SHAPE, compact_fixed=FIXED - 1_000, compact_layers=sizes(COMPACT_LAYER))
    draft = draft_of(40_000)
    ask = Ask(contexts=(4096,), drafts=(draft,), tree_tokens=8, workspace=5_000, smaller_trees=((4, 0),))
    tokens = 700 + 4
    room = FIXED - 1_000 + 2 * SHAPE.kv_bytes(tokens) + SHAPE.pass_bytes(700, 4) + 40_000 + 2 * COMPACT_LAYER
    with pytest.raises(PlanRefusal) as refused:
        plan_memory(target, ask, cpu(room))
    assert refused.value.fits == "--context 700 would fit"
