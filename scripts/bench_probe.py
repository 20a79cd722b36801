"""The startup probe of `--budget auto` on the shipped defaults: what a first `specchat run` on a
machine waits for before its first reply (the costs are kept after it). Loads the default pair
once, then times `probe_costs` over the app's own cap, `--runs` times, and prints each run's
seconds and the sizes it reached. Machine choices are kept in a temporary folder, so nothing is
read from or written to the user's cache but the models.

    python scripts/bench_probe.py                # 2 runs
    python scripts/bench_probe.py --runs 3 --offload disk
"""

import argparse
import os
import tempfile
import time

from specchat.decoding.probe import probe_costs
from specchat.engine_options import EngineOptions
from specchat.loader import load_models


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--offload", default="none", help="--offload as the CLI takes it: none, disk, auto")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as probes:
        os.environ["SPECCHAT_PROBE_DIR"] = probes  # the load's own machine choices, not the user's
        models = load_models(EngineOptions(offload=args.offload), progress=False)
        cap = models.auto_cap()
        print(f"identity: {models.identity}; auto's cap {cap}")
        for run in range(args.runs):
            start = time.perf_counter()
            costs = probe_costs(models.target, models.draft, cap)
            seconds = time.perf_counter() - start
            print(f"run {run}: probe {seconds:.1f} s; target sizes {costs.target_n}, "
                  f"one-token pass {costs.target_s[0]:.3f} s, widest {costs.target_s[-1]:.3f} s; "
                  f"draft sizes {costs.draft_b}")
        models.close()


if __name__ == "__main__":
    main()
