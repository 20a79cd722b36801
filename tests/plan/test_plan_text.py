"""plan/text.py: a memory plan in the lines the loading screen, stderr and doctor show, read from
plans of the paper's pair on a described GPU machine (a device and a host tier) and of a plan with
one tier and no draft, as a CPU's is."""

from dataclasses import replace

from helpers.plan_sizes import gpu_plan

from specchat.plan.budget import Item
from specchat.plan.placement import Rooms
from specchat.plan.text import describe_plan
from specchat.transfer import gb


def test_a_gpu_plan_names_its_draft_each_tier_with_its_items_the_placement_and_auto_choices():
    memory = gpu_plan("llama-2-70b-gptq", "llama-2-7b", 24, 64)
    lines = describe_plan(memory, 25.0, 3.0)
    device = sum(item.nbytes for item in memory.items if item.tier == "device")
    host = sum(item.nbytes for item in memory.items if item.tier == "host")
    assert device and host  # the card holds some of the plan and the pinned RAM the rest
    assert lines[0] == f"memory plan: context {memory.context} tokens, draft in {memory.draft.form}"
    assert lines[1].startswith(f"  {memory.rooms.device_name}: {gb(device)} planned (")
    assert lines[2].startswith(f"  {memory.rooms.host_name}: {gb(host)} planned (")
    for item in memory.items:  # each item on its own tier's line alone
        on = f"{item.what} {gb(item.nbytes)}"
        assert (on in lines[1], on in lines[2]) == (item.tier == "device", item.tier == "host"), on
    assert lines[3] == f"  {memory.placement.describe(25.0, 3.0)}"
    assert "s per pass at" in lines[3]  # the links' speeds reach the placement's line
    assert memory.notes and lines[4:] == [f"  auto: {note}" for note in memory.notes]


def test_a_plan_with_one_tier_and_no_draft_has_no_host_line():
    memory = gpu_plan("llama-2-70b-gptq", "llama-2-7b", 24, 64)
    rooms = Rooms(device=memory.rooms.device, host=None, disk=memory.rooms.disk, device_name="RAM (--ram-budget 40 GB)")
    items = (Item("device", "target fixed parts", 3 * 10**9), Item("device", "KV cache", 10**9))
    one_tier = replace(memory, draft=None, rooms=rooms, items=items, notes=())
    assert describe_plan(one_tier, None, None) == [
        f"memory plan: context {memory.context} tokens, no draft",
        f"  RAM (--ram-budget 40 GB): {gb(4 * 10**9)} planned "
        f"(target fixed parts {gb(3 * 10**9)}, KV cache {gb(10**9)})",
        f"  {memory.placement.describe(None, None)}",
    ]
