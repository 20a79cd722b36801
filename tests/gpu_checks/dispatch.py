"""What scripts/gpu_check.py runs once its options are read and a device is found: the checks,
`--scale` or `--pair`, on the CUDA device (or, for a dry run, the CPU), in a scratch folder beside the
user cache."""

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from gpu_checks.closing import closing_line
from gpu_checks.embedded_weights import missing_weights, needing_weights
from gpu_checks.int4_reference import CHECK as INT4_REFERENCE
from gpu_checks.int4_reference import check_int4_reference
from gpu_checks.pair import DRY_PAIR, FULL_PAIR, run_pair
from gpu_checks.scale import run_scale
from gpu_checks.scale_sizes import scale_sizes
from gpu_checks.suite import Check, all_checks, run_all
from gpu_checks.verdict import Verdict, exit_code, table

from specchat.paths import cache_dir


def progress(verdict: Verdict) -> None:
    print(f"{verdict.status}  {verdict.check}", flush=True)


def checks(device: torch.device, scratch: Path) -> list[Check]:
    listed = needing_weights(all_checks(device, scratch), missing_weights())
    return [*listed, (INT4_REFERENCE, lambda: check_int4_reference(device))]


def run_checks(device: torch.device, scratch: Path) -> int:
    print(f"checking on {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
          flush=True)
    verdicts = run_all(checks(device, scratch), progress)
    print(table(verdicts))
    print(closing_line(verdicts))
    return exit_code(verdicts)


def run(options: argparse.Namespace, device: torch.device) -> int:
    """The exit code of what `options` ask for on `device`."""
    # Beside the user cache, where the app writes its layer file: /tmp may be a tmpfs, without
    # the O_DIRECT reads the disk tier is checked for.
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-", dir=cache_dir()) as scratch:
        if options.scale:
            return run_scale(scale_sizes(options.dry_run, options.layers), device, Path(scratch), options.parts)
        if options.pair:
            sizes = DRY_PAIR if options.dry_run else FULL_PAIR
            sizes = replace(sizes, budgets=options.budgets or sizes.budgets, also=options.also,
                            trace_also=options.trace_also)
            return run_pair(sizes, device, Path(scratch), options.only, options.trace)
        return run_checks(device, Path(scratch))
