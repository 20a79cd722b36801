"""DSI's thread workers beside the drafter's captured step on one CUDA device: greedy and seeded
DSI over a small float32 Qwen2 pair (the draft the target's weights, its step captured in CUDA
graphs as the app's is) emit the target's autoregressive tokens, and the drafter captured its
steps while workers verified. CUDA fails a capture, or the other thread's call, when another
thread synchronizes the device or allocates on it meanwhile (capture_gate.py keeps the two
apart; this pairing has not yet run on a GPU). On a CPU there is nothing to capture:
tests/dsi and test_capture_gate.py check the gate's order there."""

import torch
from gpu_checks.captured_draft import NEW_TOKENS, PROMPT, SAMPLINGS, draft_model, replies
from gpu_checks.tiny_models import random_model, small_config
from gpu_checks.verdict import Verdict, judged, skipped

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.forward import CausalLM
from specchat.decoding.static_step import static_draft
from specchat.dsi.engine import DSIEngine
from specchat.dsi.workers import WorkerPool, thread_workers

CHECK = "DSI thread workers beside the captured draft step: target tokens"
WORKERS = 2
LOOKAHEAD = 2


def check_dsi_captured(device: torch.device) -> Verdict:
    if device.type != "cuda":
        return skipped(CHECK, "CUDA graphs need a CUDA device")
    config = small_config("qwen2")
    target = CausalLM(random_model(config, seed=0).to(device))
    draft = static_draft(CausalLM(draft_model(config, device, "none")), len(PROMPT) + NEW_TOKENS + 64, capture=True)
    pool = WorkerPool(thread_workers(target, [device] * WORKERS))
    details, passed = [], True
    try:
        engine = DSIEngine(draft, pool, [], lookahead=LOOKAHEAD)
        for sampling in SAMPLINGS:
            same = replies(engine, sampling)[0] == replies(AutoregressiveEngine(target, []), sampling)[0]
            passed = passed and same
            details.append(f"t={sampling.temperature:g}: tokens {'= autoregressive' if same else 'DIFFER'}")
    finally:
        pool.close()
    captured = draft.graphs_captured()
    details.append(f"{captured} draft steps captured")
    return judged(CHECK, passed and captured > 0, "; ".join(details))
