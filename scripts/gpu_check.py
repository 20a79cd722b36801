"""Checks specchat's offloading on a CUDA machine (run through scripts/gpu_check.sh).

1. Offloaded vs resident logits on CUDA: the default target in float32, all layers on the GPU
   against the same model with its last layers streamed from pinned RAM over PCIe.
2. Pinned host-to-device bandwidth: doctor's probe against what the streamer moved.
3. A short specexec run with --offload auto through the command line.
Prints one PASS / FAIL line per check; exits 1 if any failed, 0 (with a message) without a GPU.
"""

import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TOLERANCE = 1e-4  # float32 on CUDA, TF32 off: the two paths run the same kernels on different buffers
STREAMED = 4  # layers streamed in check 1


def report(name: str, passed: bool, detail: str) -> bool:
    print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}", flush=True)
    return passed


def check_logits(offload_dir: Path) -> tuple[bool, float]:
    """The logits check, and the streamer's measured host-to-device GB/s for the next one."""
    from specchat.decoding.forward import CausalLM
    from specchat.decoding.kvcache import new_cache
    from specchat.models.loading import load, load_offloaded
    from specchat.models.registry import DEFAULT_TARGET
    from specchat.offload.build import OffloadPlan
    from specchat.progress import Reporter

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    prompt = torch.arange(100, 140)

    def last_rows(lm: CausalLM) -> torch.Tensor:
        return lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache())[-4:]).cpu()

    resident = load(DEFAULT_TARGET, torch.float32, progress=False)
    resident.model.to(device)
    layers = resident.model.config.num_hidden_layers
    expected = last_rows(CausalLM(resident.model))
    del resident
    gc.collect()
    torch.cuda.empty_cache()
    plan = OffloadPlan(tier="ram", offload_dir=offload_dir, resident_layers=layers - STREAMED)
    target, offload = load_offloaded(DEFAULT_TARGET, torch.float32, device, plan, Reporter(bars=False))
    try:
        got = last_rows(CausalLM(target.model, offload))
        moved = offload.stats()
    finally:
        offload.close()
    error = (got - expected).abs().max().item()
    passed = report("offloaded vs resident logits (cuda, float32)", error <= TOLERANCE,
                    f"max |difference| {error:.2e} (bound {TOLERANCE:g}), {STREAMED} layers streamed from pinned RAM")
    return passed, moved.gbps


def check_bandwidth(streamed_gbps: float) -> bool:
    from specchat.offload.probe import measure_h2d_gbps

    probed = measure_h2d_gbps()
    ratio = streamed_gbps / probed if probed else 0.0
    return report("pinned host->device bandwidth", ratio >= 0.5,
                  f"doctor's probe {probed:.2f} GB/s, streamer {streamed_gbps:.2f} GB/s ({ratio:.2f} of the probe; "
                  "small layers and per-layer events cost some)")


def check_specexec(offload_dir: Path) -> bool:
    command = [sys.executable, "-m", "specchat", "generate", "Write a Python function that adds two numbers.",
               "--offload", "auto", "--offload-dir", str(offload_dir), "--max-new-tokens", "24", "--json"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        return report("specexec with --offload auto", False, (run.stderr.strip().splitlines() or ["no output"])[-1])
    summary = json.loads(run.stdout)["summary"]
    plan = next((line for line in run.stderr.splitlines() if line.startswith("offload plan: ")), "everything resident")
    return report("specexec with --offload auto", summary["new_tokens"] > 0,
                  f"{summary['new_tokens']} tokens at {summary['tokens_per_s']:.2f} tok/s, gen rate "
                  f"{summary['gen_rate']:.2f}, link idle {summary['link_idle']:.0%}; {plan}")


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing to check (this script is for GPU machines)")
        return 0
    print(f"checking on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="specchat-gpu-check-") as scratch:
        logits_ok, streamed_gbps = check_logits(Path(scratch))
        results = [logits_ok, check_bandwidth(streamed_gbps), check_specexec(Path(scratch))]
    print("all checks passed" if all(results) else "some checks FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
