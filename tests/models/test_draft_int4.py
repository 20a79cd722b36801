"""--draft-quant int4 through the loader: a safetensors draft filled one layer at a time, each
layer's linears rounded to 4 bits as it arrives (models/draft_approx.py), holding the bytes the
plan counts for it, and SpecExec over it emitting the target's own tokens."""

import torch
from helpers.draft_checkpoints import CPU, GREEDY, SEEDED, saved_model
from helpers.engines import run

from specchat.checkpoint.skeleton import build_skeleton
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.draft import DraftQuant, load_draft
from specchat.models.loading import load
from specchat.offload.host_embedding import host_lookup
from specchat.plan.demand import draft_weight_bytes, unique_tensors
from specchat.plan.sizes import host_embedding_bytes
from specchat.progress import Reporter
from specchat.quant.int4 import Int4Linear

def test_an_int4_draft_loads_rounded_holds_what_the_plan_counts_and_keeps_the_targets_tokens(tmp_path):
    config = saved_model(tmp_path)
    target = load(str(tmp_path), torch.float32, progress=False)
    draft = load_draft(str(tmp_path), CPU, torch.bfloat16, None, target.tokenizer, Reporter(False), DraftQuant("int4"),
                       None)
    for layer in draft.model.model.layers:
        assert any(isinstance(module, Int4Linear) for module in layer.modules())
    # a draft's 4-bit linears may run int4_gemm's kernel on CUDA (quant/widths.in_registers); a target's never
    assert all(module.registers for module in draft.model.modules() if isinstance(module, Int4Linear))
    held = sum(t.numel() * t.element_size() for t in unique_tensors(draft.model))
    skeleton = build_skeleton(config, None, torch.bfloat16, kernel=CPU)
    assert held == draft_weight_bytes(skeleton, torch.bfloat16, "int4", kernel=CPU)
    target_lm = CausalLM(target.model)
    for sampling in (GREEDY, SEEDED):
        reference, _ = run(AutoregressiveEngine(target_lm, []), sampling)
        engine = TreeEngine(SPECEXEC, target_lm, draft, [], TreeShape(budget=12, max_depth=6))
        assert run(engine, sampling)[0] == reference


def test_with_its_input_embedding_on_the_host_it_holds_the_rest_and_keeps_the_targets_tokens(tmp_path):
    """Beside a GPU the plan holds an untied draft's input embedding in host RAM: the draft loads it
    there (layer by layer, as a full-weight checkpoint loads), holds what the plan counts for the
    device less that embedding, and SpecExec over it still emits the target's tokens."""
    config = saved_model(tmp_path)
    target = load(str(tmp_path), torch.float32, progress=False)
    draft = load_draft(str(tmp_path), CPU, torch.bfloat16, None, target.tokenizer, Reporter(False),
                       DraftQuant("int4", host_embedding=True), None)
    table = host_lookup(draft.model)
    assert table is not None and table.weight.dtype == torch.bfloat16
    held = sum(t.numel() * t.element_size() for t in unique_tensors(draft.model))  # the table is not the model's
    skeleton = build_skeleton(config, None, torch.bfloat16, kernel=CPU)
    counted = draft_weight_bytes(skeleton, torch.bfloat16, "int4", kernel=CPU)
    embedding = host_embedding_bytes(skeleton, torch.bfloat16)
    assert embedding and held == counted - embedding
    target_lm = CausalLM(target.model)
    reference, _ = run(AutoregressiveEngine(target_lm, []), GREEDY)
    assert run(TreeEngine(SPECEXEC, target_lm, draft, [], TreeShape(budget=12, max_depth=6)), GREEDY)[0] == reference
