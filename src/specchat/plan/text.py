"""A memory plan in words: what the loading screen, stderr and `specchat doctor` show."""

from specchat.plan.budget import MemoryPlan
from specchat.transfer import gb


def describe_plan(memory: MemoryPlan, ram_gbps: float | None, disk_gbps: float | None) -> list[str]:
    """A few lines: the context and draft, each tier's total against its room, the layers' placement,
    and what auto chose."""
    draft = "no draft" if memory.draft is None else f"draft in {memory.draft.form}"
    lines = [f"memory plan: context {memory.context} tokens, {draft}",
             f"  {tier_line(memory, 'device', memory.rooms.device_name)}"]
    if memory.rooms.host is not None:
        lines.append(f"  {tier_line(memory, 'host', memory.rooms.host_name)}")
    lines.append(f"  {memory.placement.describe(ram_gbps, disk_gbps)}")
    return lines + [f"  auto: {note}" for note in memory.notes]


def tier_line(memory: MemoryPlan, tier: str, room_name: str) -> str:
    parts = ", ".join(f"{item.what} {gb(item.nbytes)}" for item in memory.items if item.tier == tier)
    return f"{room_name}: {gb(memory.total(tier))} planned ({parts})"
