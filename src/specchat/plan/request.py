"""What a run asks of the machine, in the plan's terms: the options that shape the memory plan,
from `run`'s command line or `doctor`'s (both through plan/options.request_for), named as the
command line names them, with the unit in the name where it is not the command line's."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from specchat.limits import auto_cap, auto_trees
from specchat.machine_links import Links
from specchat.plan.draft_form import Draft
from specchat.plan.placement import Request

Tier = Literal["auto", "none", "ram", "disk"]  # --offload
DEFAULT_TREE_TOKENS = 1024  # the largest tree a CPU's --budget auto builds (limits.auto_cap)


@dataclass(frozen=True)
class PlanRequest:
    """The offload options and the largest passes; `plan.model.plan_model` turns them into a
    `MemoryPlan` for one model on a machine."""

    tier: Tier  # --offload; none: every layer on the device
    offload_dir: Path  # --offload-dir: where the disk tier's layer file lives
    resident_layers: int | None = None  # --resident-layers; None: as many as fit
    slots: int | None = None  # ring size; None: what the room left holds, up to a whole pass
    ram_budget_bytes: int | None = None  # --ram-budget: RAM specchat may take; None: what the process may take
    vram_budget_bytes: int | None = None  # --vram-budget: the whole GPU's share (every device item); None: what is free
    tree_tokens: int = DEFAULT_TREE_TOKENS  # the largest tree a pass scores (activation headroom)
    smaller_trees: tuple[int, ...] = ()  # smaller largest trees auto may fall back to, in order
    contexts: tuple[int, ...] = ()  # the KV room's length, in order of preference; (): the model's own
    drafts: tuple[Draft | None, ...] = (None,)  # the draft's candidate forms, preferred first
    # a CPU's 4-bit linears may keep dense copies for wide inputs where room is left (quant/int4_dense.py)
    dense_copies: bool = False
    links: Links = Links()  # the offload links' speeds, where known: a draft form is then chosen by predicted speed
    conversations: int | None = 1  # KV caches kept at once: serve's --slots, one a slot; None: auto (conversations.py)

    def placement_request(self, layers: int) -> Request:
        """--offload, --resident-layers and the ring as the placement of a model of `layers`
        decoder layers takes them. --offload none keeps every layer on the device: all `layers`
        resident, so none streams and the placement's tier, which says only where streamed layers
        go, places nothing (auto stands in for it)."""
        if self.tier == "none":
            return Request("auto", resident_layers=layers, slots=self.slots)
        return Request(self.tier, self.resident_layers, self.slots)


@dataclass(frozen=True)
class Pair:
    """The models a run plans for, as the user named them."""

    target: str
    dtype: torch.dtype
    weights: str = "dense"  # --weights as resolve_weights decides it: quantized (its 4-bit weights) or dense
    draft: str | None = None  # None: no draft
    draft_kinds: tuple[str, ...] = ("none",)  # the draft quantizations the plan may choose among, preferred first
    dense_above: int | None = None  # int8: steps wider than this many rows multiply dense copies (None: none)
    draft_vocab: int | None = None  # --draft-vocab; None: the whole vocabulary
    context: int | None = None  # --context; None: the default, which auto may shrink
    measure_steps: bool = False  # time a step of each draft form on this machine, where the plan may choose among several


def tree_sizes(cuda: bool, budget: int = 0) -> tuple[int, tuple[int, ...]]:
    """(the largest tree a pass scores, the smaller ones auto may fall back to): --budget auto's cap
    on this kind of device, or an explicit --budget past it (plus the root a pass scores with it);
    never a fallback below a --budget given (0: none given)."""
    trees = auto_trees(auto_cap(cuda=cuda, offloaded=True))
    return max(trees[0], budget + 1), tuple(tree for tree in trees[1:] if tree > budget)
