"""The scale check's draft: a Llama-2-7B-shaped bf16 model (all its layers on a GPU, a few in the
dry run), its step over n tree tokens after the cached prefix (its decoder layers, then the LM head
over every row, as a draft scores each new node), timed per layer and scaled to the whole model's
DRAFT_SCALED_LAYERS where fewer are built (a step's fixed costs are then counted per layer); eager,
and at a width bucket's static shapes (decoding/static_step.py), captured in CUDA graphs on a GPU
(run eagerly elsewhere). Steps wider than the largest bucket run eagerly either way. In another
`form`, the same draft's decoder linears rounded to 4 bits (--draft-quant int4) or in fp8
(--draft-quant fp8), forms the plan weighs against bf16 on a card."""

from dataclasses import dataclass, replace

import torch
from gpu_checks.markdown import markdown_table, ms
from gpu_checks.scale_models import alias_config, prepared_as_draft, random_draft
from gpu_checks.scale_sizes import DRAFT_ALIAS, DRAFT_SCALED_LAYERS, ScaleSizes
from gpu_checks.suite import release_memory
from gpu_checks.timing import fastest_ms
from gpu_checks.tree_passes import prefilled, random_tree, tree_pass
from gpu_checks.verdict import Verdict, judged, skipped
from transformers import PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.decoding.static_step import BUCKETS, static_draft

STEP_MS = 10.0  # issue 48: a 7B draft's step within 10 ms at 1-256 new tokens (gpt-fast: ~9.5 ms on an A100)
STEP_TOKENS = 256


@dataclass(frozen=True)
class DraftRow:
    tokens: int
    layer_ms: float
    head_ms: float
    static_layer_ms: float  # the same step at its bucket's static shapes
    plain_static_layer_ms: float | None = None  # that step of the model as transformers builds it (bf16 only)

    @property
    def step_ms(self) -> float:
        return self.layer_ms * DRAFT_SCALED_LAYERS + self.head_ms

    @property
    def static_step_ms(self) -> float:
        return self.static_layer_ms * DRAFT_SCALED_LAYERS + self.head_ms

    @property
    def plain_static_step_ms(self) -> float | None:
        return None if self.plain_static_layer_ms is None else self.plain_static_layer_ms * DRAFT_SCALED_LAYERS \
            + self.head_ms


def draft_rows(sizes: ScaleSizes, device: torch.device, form: str = "none") -> list[DraftRow]:
    """The draft's rows as the loader prepares it in `form`; in bf16 beside them the captured step
    of the same weights as transformers builds them (no stacked projections, its norms), in the
    same run."""
    config, _ = alias_config(DRAFT_ALIAS, sizes.draft_layers, sizes.draft_shrink)
    prepared = step_timings(prepared_as_draft(random_draft(config, device), form, device), sizes, device)
    rows = [DraftRow(n, *timings) for n, timings in zip(sizes.draft_widths, prepared)]
    if form != "none":
        return rows
    plain = step_timings(random_draft(config, device), sizes, device)  # the same seed: the same weights
    return [replace(row, plain_static_layer_ms=timings[2]) for row, timings in zip(rows, plain)]


def step_timings(model: PreTrainedModel, sizes: ScaleSizes, device: torch.device) -> list[tuple[float, float, float]]:
    """Per width of sizes.draft_widths: ms a layer eagerly, the LM head's ms, ms a layer at the
    bucket's static shapes (captured on CUDA)."""
    lm = CausalLM(model)
    static = static_draft(lm, sizes.cached + max(sizes.draft_widths) + BUCKETS[-1], capture=device.type == "cuda")
    try:
        cache, static_cache = prefilled(lm, sizes.cached), prefilled(static, sizes.cached)
        timings = []
        for n in sizes.draft_widths:
            tree = random_tree(n, sizes.cached, model.config.vocab_size, seed=n)
            layers_ms = fastest_ms(lambda: tree_pass(lm, cache, sizes.cached, tree), device)
            static_ms = fastest_ms(lambda: tree_pass(static, static_cache, sizes.cached, tree), device)
            hidden = tree_pass(lm, cache, sizes.cached, tree)
            timings.append((layers_ms / sizes.draft_layers, fastest_ms(lambda: lm.logits(hidden), device),
                            static_ms / sizes.draft_layers))
        return timings
    finally:
        del model, lm, static
        release_memory()


def draft_table(rows: list[DraftRow]) -> str:
    return markdown_table(
        ["tree tokens n", "ms a layer", "LM head, ms", f"step, {DRAFT_SCALED_LAYERS} layers, ms",
         "static step (captured on CUDA), ms", "the same, as transformers builds it, ms"],
        [[str(row.tokens), ms(row.layer_ms), ms(row.head_ms), ms(row.step_ms), ms(row.static_step_ms),
          ms(row.plain_static_step_ms)] for row in rows])


def draft_verdict(rows: list[DraftRow], dry_run: bool, form: str = "bf16") -> Verdict:
    """The draft's captured step in `form` at every width up to STEP_TOKENS within STEP_MS."""
    check = f"a {DRAFT_ALIAS} shaped {form} draft's captured step at 1-{STEP_TOKENS} tokens"
    if dry_run:
        return skipped(check, "dry run: no verdict")
    slowest = max((row for row in rows if row.tokens <= STEP_TOKENS), key=lambda row: row.static_step_ms)
    return judged(check, slowest.static_step_ms <= STEP_MS,
                  f"{slowest.static_step_ms:.2f} ms at most ({slowest.tokens} tokens), bound {STEP_MS:g} ms")
