"""--draft-quant fp8 through the loader: a safetensors draft filled one layer at a time, each
layer's linears turned to fp8 as it arrives (models/draft_approx.py), holding the bytes the plan
counts for it, and SpecExec over it emitting the target's own tokens, greedy and seeded."""

import torch
from helpers.draft_checkpoints import CPU, GREEDY, SEEDED, saved_model
from helpers.engines import run
from transformers import AutoModelForCausalLM

from specchat.checkpoint.skeleton import build_skeleton
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.draft import DraftQuant, load_draft
from specchat.models.loading import load
from specchat.plan.demand import draft_weight_bytes, unique_tensors
from specchat.progress import Reporter
from specchat.quant.fp8 import Fp8Linear


def test_an_fp8_draft_holds_what_the_plan_counts_and_keeps_the_targets_tokens(tmp_path):
    config = saved_model(tmp_path)
    target = load(str(tmp_path), torch.float32, progress=False)
    draft = load_draft(str(tmp_path), CPU, torch.bfloat16, None, target.tokenizer, Reporter(False), DraftQuant("fp8"),
                       None)
    linears = [module for layer in draft.model.model.layers for module in layer.modules()
               if isinstance(module, (Fp8Linear, torch.nn.Linear))]
    assert len(linears) == 7 * config.num_hidden_layers and all(isinstance(m, Fp8Linear) for m in linears)
    held = sum(t.numel() * t.element_size() for t in unique_tensors(draft.model))
    skeleton = build_skeleton(config, None, torch.bfloat16, kernel=CPU)
    assert held == draft_weight_bytes(skeleton, torch.bfloat16, "fp8", kernel=CPU)
    dense = CausalLM(AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16))
    tokens = torch.tensor([5, 9, 2, 7])
    ran, expected = (lm.hidden(tokens, torch.arange(4), new_cache()).float() for lm in (draft, dense))
    # rounded to fp8, near: 0.041 of the dense hidden states' norm apart (AMD EPYC, 2026-11-30)
    assert not torch.equal(ran, expected) and (ran - expected).norm() <= 0.08 * expected.norm()
    target_lm = CausalLM(target.model)
    for sampling in (GREEDY, SEEDED):
        reference, _ = run(AutoregressiveEngine(target_lm, []), sampling)
        engine = TreeEngine(SPECEXEC, target_lm, draft, [], TreeShape(budget=12, max_depth=6))
        tokens, events = run(engine, sampling)
        assert tokens == reference and sum(event.accepted for event in events) > 0
