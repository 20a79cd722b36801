"""Checks specchat on a CUDA machine (run through scripts/gpu_check.sh) and prints a table with a
verdict per check (PASS, FAIL, or SKIP with its reason); exits 1 if any check failed, and 0 with
a message where torch sees no CUDA device.

1. A ring smaller than a pass, reused over several passes (one tree-masked): small Llama and
   Qwen2 models of 8 layers through 2 and 3 slots, logits against the model held whole on the GPU.
2. A 4-bit GPTQ target streamed packed from pinned RAM and from the disk file, logits against the
   in-memory GPTQ model.
3. nf4 and int8 drafts: a SpecExec reply of the default pair with each equals the target's
   greedy reply (float32; a difference passes only at a near-tie, tests/exactness.py).
4. The `--budget auto` probe's pass costs against the same passes timed with CUDA events.
5. `--offload auto` with the smallest `--vram-budget` the plan accepts: the default pair streams,
   and its reply equals the target's greedy reply.
6. The streamer's pinned host->device bandwidth against `specchat doctor`'s probe.
The checks live in tests/gpu_checks/, shared with tests/test_cuda.py (pytest -m cuda).
"""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checks live with the tests
from gpu_checks.suite import all_checks, run_all  # noqa: E402
from gpu_checks.verdict import Verdict, exit_code, table  # noqa: E402

from specchat.paths import cache_dir  # noqa: E402


def progress(verdict: Verdict) -> None:
    print(f"{verdict.status}  {verdict.check}", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing to check (this script is for GPU machines)")
        return 0
    print(f"checking on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
          flush=True)
    # Beside the user cache, where the app writes its layer file: /tmp may be a tmpfs, without
    # the O_DIRECT reads the disk tier is checked for.
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-", dir=cache_dir()) as scratch:
        verdicts = run_all(all_checks(torch.device("cuda"), Path(scratch)), progress)
    print(table(verdicts))
    print("all checks passed" if exit_code(verdicts) == 0 else "some checks FAILED")
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
