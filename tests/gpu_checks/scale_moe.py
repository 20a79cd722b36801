"""The scale check's MoE target: a Mixtral-8x7B-GPTQ-shaped one (the alias's config, random 4-bit
experts written one by one) streamed from pinned RAM through a ring smaller than a pass, by expert,
as whole layers, and as the default does (by expert, the ring loading whole layers after calls
that routed to 90% of their experts: offload/experts.py). Per tree size: the pass's time and the bytes it
streamed, a layer. By expert, a one-token pass moves a layer's head and its 2 experts of 8; a tree
of 16 tokens already routes to nearly all 8 (E(1 - (1 - k/E)^n)), and then both ways move the same
bytes."""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_checks.markdown import markdown_table, ms
from gpu_checks.scale_models import alias_config, write_random_4bit
from gpu_checks.scale_sizes import SLOTS, ScaleSizes
from gpu_checks.suite import release_memory
from gpu_checks.timing import fastest_ms
from gpu_checks.tree_passes import Tree, prefilled, random_tree, tree_pass

from specchat.decoding.forward import CausalLM
from specchat.offload.build import offload_model
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter

MOE_ALIAS = "mixtral-8x7b-gptq"
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class MoeRow:
    tokens: int
    by_expert_ms: float  # a layer, every call fetching its routed experts
    by_expert_mb: float  # streamed a layer
    whole_ms: float
    whole_mb: float
    default_ms: float  # by expert, the ring loading whole layers after calls that routed to 90% of their experts
    default_mb: float


def streamed_rows(directory: Path, device: torch.device, workdir: Path, sizes: ScaleSizes, trees: list[Tree],
                  by_expert: bool, whole_loads: bool = False) -> list[tuple[float, float]]:
    """Per tree: ms and MB a layer of a pass with every layer streamed from (pinned) RAM."""
    request = PlanRequest(tier="ram", offload_dir=workdir, resident_layers=0, slots=SLOTS, tree_tokens=max(sizes.trees))
    planned = plan_checkpoint(directory, directory.name, DTYPE, Machine(kind=device.type), request).placement
    # no expert cache: a big card's room would keep every expert after the untimed pass, and the
    # table would time the heads alone (an H200's first run read 21.8 MB a layer at every width)
    placement = dataclasses.replace(planned, expert_cache=0)
    model, offload = offload_model(directory, directory.name, DTYPE, device, placement, workdir,
                                   Reporter(bars=False), by_expert=by_expert, whole_loads=whole_loads)
    lm = CausalLM(model, offload)
    try:
        cache = prefilled(lm, sizes.cached)
        rows = []
        for tree in trees:
            passes = 0

            def run() -> None:
                nonlocal passes
                tree_pass(lm, cache, sizes.cached, tree)
                passes += 1

            before = lm.transfer_stats()
            seconds = fastest_ms(run, device)
            # the bytes of all its passes, a pass: the loads in flight as they begin and end are the ring's few
            moved = (lm.transfer_stats() - before).bytes / passes
            rows.append((seconds / sizes.layers, moved / sizes.layers / 1e6))
        return rows
    finally:
        offload.close()
        del model, lm
        release_memory()


def moe_rows(sizes: ScaleSizes, device: torch.device, workdir: Path, say: Callable[[str], None]) -> list[MoeRow]:
    config, settings = alias_config(MOE_ALIAS, sizes.layers, sizes.moe_shrink)
    say(f"writing a random 4-bit {MOE_ALIAS} of {sizes.layers} layers ...")
    directory = write_random_4bit(config, settings, workdir / "moe-target")
    trees = [random_tree(n, sizes.cached, config.vocab_size, seed=n) for n in sizes.trees]
    say(f"timing its passes streamed by expert, as whole layers, then by expert with whole layers after "
        f"widely routed calls (the default), through {SLOTS} slots ...")
    by_expert = streamed_rows(directory, device, workdir, sizes, trees, by_expert=True)
    whole = streamed_rows(directory, device, workdir, sizes, trees, by_expert=False)
    default = streamed_rows(directory, device, workdir, sizes, trees, by_expert=True, whole_loads=True)
    return [MoeRow(n, *e, *w, *d) for n, e, w, d in zip(sizes.trees, by_expert, whole, default, strict=True)]


def moe_table(rows: list[MoeRow]) -> str:
    return markdown_table(
        ["tree tokens n", "by expert, ms a layer", "by expert, MB a layer", "whole layers, ms a layer",
         "whole layers, MB a layer", "default, ms a layer", "default, MB a layer"],
        [[str(r.tokens), ms(r.by_expert_ms), f"{r.by_expert_mb:.1f}", ms(r.whole_ms), f"{r.whole_mb:.1f}",
          ms(r.default_ms), f"{r.default_mb:.1f}"] for r in rows])
