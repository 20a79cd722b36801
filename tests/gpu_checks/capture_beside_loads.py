"""Draft captures beside the streamer's loads on one CUDA device: a loader thread moves layers
into ring slots through the app's CudaMover (event waits, copies on its stream) while the main
thread captures a step as the draft's are captured (cuda_graph.capture_graph) again and again,
and every capture replays exactly what the step computes eagerly.
CUDA fails a capture while another thread synchronizes on an event in global capture mode; the
mover's calls take the capture gate (capture_gate.py), so none may overlap one. No GPU has run
this pairing yet."""

import threading

import torch
from gpu_checks.verdict import Verdict, judged, skipped

from specchat.cuda_graph import capture_graph
from specchat.offload.cuda import CudaMover

CHECK = "draft captures beside the streamer's loads: every capture replays its step"
CAPTURES = 50
SLOT_BYTES = 64 << 20  # a layer's worth of copy: each load takes the link a few milliseconds


def check_capture_beside_loads(device: torch.device) -> Verdict:
    if device.type != "cuda":
        return skipped(CHECK, "CUDA graphs need a CUDA device")
    mover = CudaMover([torch.empty(SLOT_BYTES, dtype=torch.uint8, device=device) for _ in range(2)])
    host = torch.randint(0, 255, (SLOT_BYTES,), dtype=torch.uint8).pin_memory()
    stop, loads, errors = threading.Event(), [0], []

    def load() -> None:
        slot = 0
        try:
            while not stop.is_set():
                mover.wait_free(slot)
                mover.issue(slot, host)
                mover.settle(slot)
                loads[0] += 1
                slot = 1 - slot
        except RuntimeError as error:  # reported in the verdict
            errors.append(f"loader: {error}")

    # small integers: every product and sum is exact in float32 (and TF32), so any kernel cuBLAS
    # picks, captured or eager, gives the same bits
    x = torch.randint(-4, 5, (64, 1024), device=device).float()
    weight = torch.randint(-4, 5, (1024, 1024), device=device).float()
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    failed = wrong = 0
    try:
        for _ in range(CAPTURES):
            try:
                graph, output = capture_graph(lambda: torch.relu(x @ weight))
                graph.replay()
                wrong += not torch.equal(output, torch.relu(x @ weight))
            except RuntimeError as error:
                failed += 1
                errors.append(f"capture: {error}")
    finally:
        stop.set()
        loader.join()
    detail = f"{CAPTURES - failed} of {CAPTURES} captures, {wrong} replays wrong, {loads[0]} loads beside them"
    return judged(CHECK, not failed and not wrong and not errors and loads[0] > 0,
                  detail + ("; " + errors[0][:200] if errors else ""))
