"""gpu_check --pair's code on a CPU at the paper pairs' widths: the whole draft (7B bf16, or 8B
AWQ), a 70B target of `layers` of its 80 layers streamed from the disk tier, one budget of 16
(ranked trees, depth 4), 3 new tokens. Usage: python run.py LAYERS PAIR_INDEX (0: llama-2-70b-gptq
with llama-2-7b, 1: llama-3.1-70b-awq with llama-3.1-8b-awq). Writes ~25 GB under the user cache."""
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import torch  # noqa: E402
from gpu_checks.pair import PairSizes, check_pair  # noqa: E402
from gpu_checks.pair_aliases import PAIRS  # noqa: E402

from specchat.paths import cache_dir  # noqa: E402

layers, pair = int(sys.argv[1]), int(sys.argv[2])
sizes = PairSizes(budgets=(16,), new_tokens=3, max_depth=4, offload=("--offload", "disk", "--resident-layers", "0"),
                  target_layers=layers)
work = cache_dir() / "pair-cpu-widths"
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
start = time.monotonic()
try:
    for verdict in check_pair(PAIRS[pair], sizes, torch.device("cpu"), work):
        print(verdict)
finally:
    usage = resource.getrusage
    print(f"wall {time.monotonic() - start:.0f} s, peak RSS of this process {usage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB, "
          f"children {usage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6:.1f} GB")
    shutil.rmtree(work, ignore_errors=True)
