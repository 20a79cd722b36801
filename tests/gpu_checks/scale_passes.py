"""The scale check's target passes: per tree size, a pass streamed from pinned RAM through a ring of
SLOTS (smaller than a pass), the same layers resident, and the time the link needs for a layer.

A ring loads the next pass's first layers as soon as slots free, as it does while a draft tree
grows; one pass over a few layers therefore starts with SLOTS of them in place and ends on compute
the link cannot hide behind, which an 80-layer pass barely sees. Passes are timed BACK_TO_BACK in a
row (each over the same tree after the same prefix), so that a layer's time approaches the steady
state of a whole model's pass."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_checks.markdown import markdown_table, ms
from gpu_checks.scale_sizes import SLOTS, ScaleSizes
from gpu_checks.suite import release_memory
from gpu_checks.timing import fastest_ms
from gpu_checks.tree_passes import Tree, prefilled, random_tree, tree_pass
from gpu_checks.verdict import Verdict, judged, skipped
from helpers.planned import offload_planned

from specchat.decoding.forward import CausalLM
from specchat.offload.build import Offload, offload_model
from specchat.plan.request import PlanRequest
from specchat.offload.probe import measure_h2d_gbps
from specchat.progress import Reporter

BACK_TO_BACK = 3
RATIO_BOUND = 1.25  # the widest tree's streamed pass over the one-token pass
DTYPE = torch.bfloat16  # CUDA's fused int4 kernel takes bf16 inputs only
QUIET = Reporter(bars=False)


@dataclass(frozen=True)
class PassRow:
    tokens: int
    streamed_ms: float  # a layer
    resident_ms: float  # a layer
    link_ms: float | None  # a layer's bytes over the pinned copy bandwidth; None without CUDA


def layer_ms(lm: CausalLM, sizes: ScaleSizes, trees: list[Tree]) -> list[float]:
    """Per tree, the fastest of a few runs of BACK_TO_BACK passes over it, in ms a layer."""
    cache = prefilled(lm, sizes.cached)

    def passes(tree: Tree) -> None:
        for _ in range(BACK_TO_BACK):
            tree_pass(lm, cache, sizes.cached, tree)

    return [fastest_ms(lambda: passes(tree), lm.device) / (BACK_TO_BACK * sizes.layers) for tree in trees]


def streamed_ms(directory: Path, device: torch.device, workdir: Path, sizes: ScaleSizes,
                trees: list[Tree]) -> tuple[list[float], int]:
    """Per tree, ms a layer with every layer streamed from (pinned) RAM through SLOTS slots; and a
    layer's bytes."""
    plan = PlanRequest(tier="ram", offload_dir=workdir, resident_layers=0, slots=SLOTS, tree_tokens=max(sizes.trees))
    model, offload = offload_planned(directory, directory.name, DTYPE, device, plan, QUIET)
    try:
        check_ring(offload)
        return layer_ms(CausalLM(model, offload), sizes, trees), offload.pass_bytes // len(offload.streamed)
    finally:
        offload.close()
        del model
        release_memory()


def check_ring(offload: Offload) -> None:
    if offload.streamer is None or offload.streamer.slots >= len(offload.streamed):
        raise RuntimeError(f"the plan put {len(offload.streamed)} layers through "
                           f"{offload.streamer.slots if offload.streamer else 0} slots: no ring smaller than a pass")


def resident_ms(directory: Path, device: torch.device, sizes: ScaleSizes, trees: list[Tree]) -> list[float]:
    model, _ = offload_model(directory, directory.name, DTYPE, device, None, None, QUIET)  # every layer on the device
    try:
        return layer_ms(CausalLM(model), sizes, trees)
    finally:
        del model
        release_memory()


def pass_rows(directory: Path, device: torch.device, workdir: Path, sizes: ScaleSizes, vocab: int,
              say: Callable[[str], None]) -> list[PassRow]:
    trees = [random_tree(n, sizes.cached, vocab, seed=n) for n in sizes.trees]
    say(f"timing passes streamed through {SLOTS} slots ...")
    streamed, layer_bytes = streamed_ms(directory, device, workdir, sizes, trees)
    say("timing the same passes with every layer resident ...")
    resident = resident_ms(directory, device, sizes, trees)
    gbps = measure_h2d_gbps()
    link = None if gbps is None else layer_bytes / (gbps * 1e9) * 1e3
    copies = "no pinned copies without CUDA" if gbps is None else f"pinned host->device copies at {gbps:.1f} GB/s"
    say(f"a streamed layer holds {layer_bytes / 1e6:.1f} MB; {copies}")
    return [PassRow(n, s, r, link) for n, s, r in zip(sizes.trees, streamed, resident, strict=True)]


def pass_table(rows: list[PassRow]) -> str:
    return markdown_table(
        ["tree tokens n", "streamed pass, ms a layer", "resident pass, ms a layer", "link, ms a layer"],
        [[str(row.tokens), ms(row.streamed_ms), ms(row.resident_ms), ms(row.link_ms)] for row in rows])


def pass_verdict(rows: list[PassRow], dry_run: bool) -> Verdict:
    widest, one = rows[-1], rows[0]
    check = f"streamed pass at {widest.tokens} tree tokens / at {one.tokens}"
    ratio = widest.streamed_ms / one.streamed_ms
    detail = f"{ratio:.2f} ({widest.streamed_ms:.3f} / {one.streamed_ms:.3f} ms a layer; bound {RATIO_BOUND:g})"
    if dry_run:
        return skipped(check, f"dry run: no verdict; {detail}")
    return judged(check, ratio <= RATIO_BOUND, detail)
