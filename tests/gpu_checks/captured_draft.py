"""The draft's step captured in CUDA graphs (decoding/static_step.py): greedy and seeded SpecExec
over a small float32 Qwen2 pair grows, tree for tree, what the same static shapes grow run
eagerly (the same kernels, replayed), and emits the target's autoregressive tokens; with the draft
rounded to 4 bits (--draft-quant int4: its products through the int4 kernels, int4_gemm's kernel
at the widths its probe finds it faster, the Triton expansion past them), in bf16, likewise, with
the widths int4_gemm served; and with its linears in fp8 (--draft-quant fp8: _scaled_mm), in bf16,
likewise; and in fp8 with its input embedding held on the host (as a draft beside a GPU holds an
untied one), its rows looked up there and staged into the captured step's buffers. That the static
shapes grow the eager step's trees is tests/decoding/test_static_step.py's, on any device."""

import torch
from gpu_checks.scale_models import prepared_as_draft
from gpu_checks.tiny_models import random_model, small_config
from gpu_checks.verdict import Verdict, judged, skipped

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.static_step import static_draft
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.offload.host_embedding import host_lookup, keep_embedding_on_host
from specchat.quant.int4 import Int4Linear
from specchat.quant.widths import gemm_span

CHECK = "draft step captured in CUDA graphs: eager trees, target tokens"
CHECKS = {"none": CHECK, "int4": "int4 draft step captured in CUDA graphs: eager trees, target tokens",
          "fp8": "fp8 draft step captured in CUDA graphs: eager trees, target tokens"}
HOSTED = ", its input embedding on the host"  # a check's name, where the draft looks its rows up there
PROMPT = [7, 3, 9, 2, 11, 5]
NEW_TOKENS = 40
SAMPLINGS = (SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 3))


def replies(engine, sampling: SamplingParams) -> tuple[list[int], list[tuple]]:
    events = list(engine.generate(PROMPT, NEW_TOKENS, sampling))
    return [t for e in events for t in e.token_ids], [(e.tree_size, e.depth, e.accepted) for e in events]


def check_captured_draft(device: torch.device, form: str = "none", hosted: bool = False) -> Verdict:
    """`form`: the draft's linears as --draft-quant has them (int4 and fp8 in bf16); `hosted`: its
    input embedding held on the host, as the loader holds an untied one beside a GPU."""
    name = CHECKS[form] + (HOSTED if hosted else "")
    if device.type != "cuda":
        return skipped(name, "CUDA graphs need a CUDA device")
    config = small_config("qwen2")
    target = CausalLM(random_model(config, seed=0).to(device))
    draft = CausalLM(draft_model(config, device, form))  # the target's weights: its trees are accepted
    if hosted:
        keep_embedding_on_host(draft.model, device, draft.dtype)
    lookup = host_lookup(draft.model)  # None unless hosted
    capacity = len(PROMPT) + NEW_TOKENS + 64
    details, passed = [], True
    for sampling in SAMPLINGS:
        reference, _ = replies(AutoregressiveEngine(target, []), sampling)
        outcomes = [replies(TreeEngine(SPECEXEC, target, static_draft(draft, capacity, capture, lookup), [],
                                       TreeShape(budget=12, max_depth=6)), sampling) for capture in (False, True)]
        same_trees = outcomes[0][1] == outcomes[1][1]
        tokens_ok = outcomes[0][0] == outcomes[1][0] == reference
        passed = passed and same_trees and tokens_ok
        details.append(f"t={sampling.temperature:g}: trees {'equal' if same_trees else 'DIFFER'}, "
                       f"tokens {'= autoregressive' if tokens_ok else 'DIFFER'}")
    if form == "int4":
        details.append(gemm_spans(draft.model))
    return judged(name, passed, "; ".join(details))


def draft_model(config, device: torch.device, form: str) -> torch.nn.Module:
    """The target's weights on `device`, prepared as a draft there, its linears in `form` (int4
    and fp8: in bf16)."""
    model = random_model(config, seed=0).to(device)
    return prepared_as_draft(model.to(torch.bfloat16) if form != "none" else model, form, device)


def gemm_spans(model: torch.nn.Module) -> str:
    """Which widths int4_gemm's kernel served at each of the draft's 4-bit shapes (widths.gemm_span)."""
    shapes = {(m.kernel, m.in_features, m.out_features, m.compute_dtype) for m in model.modules()
              if isinstance(m, Int4Linear)}
    served = []
    for kernel, in_features, out_features, dtype in sorted(shapes, key=lambda shape: shape[1:3]):
        span = gemm_span(kernel, in_features, out_features, dtype)
        served.append(f"{in_features}x{out_features}: " + ("never" if span is None else f"{span[0]}-{span[1]} rows"))
    return "int4_gemm served " + ", ".join(served)
