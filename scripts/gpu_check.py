"""Checks specchat on a CUDA machine (run through scripts/gpu_check.sh) and prints a table with a
verdict per check (PASS, FAIL, or SKIP with its reason), then one closing line that names what
failed or was skipped; exits 1 if any check failed, and 0 with a message where torch sees no CUDA
device.

1. A ring smaller than a pass, reused over several passes (one tree-masked): small Llama and
   Qwen2 models of 8 layers through 2 and 3 slots, logits against the model held whole on the GPU.
2. A 4-bit GPTQ target streamed packed from pinned RAM and from the disk file, logits against the
   in-memory GPTQ model.
3. nf4 and int8 drafts: a SpecExec reply of the default pair with each equals the target's
   greedy reply (float32; a difference passes only at a near-tie, tests/helpers/exactness.py).
4. The `--budget auto` probe's pass costs against the same passes timed with CUDA events.
5. `--offload auto` with the smallest `--vram-budget` the plan accepts: the default pair streams,
   and its reply equals the target's greedy reply.
6. The streamer's pinned host->device bandwidth against `specchat doctor`'s probe.
7. The int4 products at the 70B target's shapes against a float64 dense reference.
8. A small Qwen3-MoE GPTQ target streamed by expert from pinned RAM and from the disk file, half its
   experts cached on the device: logits against the in-memory model.
9. Greedy and seeded SpecExec over a small bfloat16 GPTQ target whose tree passes expand (the Triton
   expansion forced from 2 rows) against its autoregressive decoding through the fused kernel:
   tokens equal under the bfloat16 near-tie rule, every tie listed with its gap.
10. The draft's step captured in CUDA graphs (decoding/static_step.py): greedy and seeded SpecExec
   over a small float32 pair grows the trees its static shapes grow eagerly, and emits the target's
   autoregressive tokens.
The checks that run the embedded pair (3, 5) fail at once where its weights are not installed.
The checks live in tests/gpu_checks/, shared with tests/scripts/test_gpu_checks_on_cuda.py (pytest -m cuda).

--pair runs the paper's pairs end to end instead (tests/gpu_checks/pair.py): llama-2-70b-gptq with
llama-2-7b, then llama-3.1-70b-awq with llama-3.1-8b-awq, written whole with random weights and run
through `specchat generate --json` at budgets 1024, 128 and 2048 under a 24 GB --vram-budget; per budget,
as its reply ends, the draft, the pass, its stall, the bytes streamed, verification and host time, and
tokens/s projected at the paper's generation rates here and on a 24 GB PCIe 4.0 card (it writes ~50 GB
of disk; the AWQ pair took 4.5 minutes on an H200; it prints each pair's writing and each reply's wall
time, and `--only TARGET` runs one pair, so that each fits a command of 10 minutes); `--trace DIR`
adds one reply at the first budget (1024) under `generate --trace` (a Chrome trace into DIR, in no row), summed up
per span and kernel; `--budgets 1024,2048` runs those budgets, and `--also '--resident-layers 0'` each
budget once more with those generate options, its row beside (an A/B of one option in one run), and
`--trace-also` gives the traced reply those options;
--pair --dry-run runs it over shrunk models on any device.

--scale runs the paper-scale check instead (tests/gpu_checks/scale.py): a Llama-2-70B-GPTQ-shaped
target streamed through a ring, per-linear products at its shapes, a Llama-2-7B-shaped draft (its
linears' products, then its step in bf16 and in 4 bits), a Mixtral-shaped target streamed by expert,
int4_gemm's blocks swept at a Llama-3.1-8B-AWQ draft's linears, the 7B draft's step profiled kernel by
kernel; `--parts draft,gemm` (of passes, linears, draft, moe, gemm, profile) runs some of them, so
that a short command measures what it is for;
--scale --dry-run runs it over shrunk widths on any device, the CPU included.
"""

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checks live with the tests
from gpu_checks.pair_aliases import PAIRS  # noqa: E402
from gpu_checks.scale_sizes import PARTS, SLOTS  # noqa: E402


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own prints the usage too: bad input is one line here
        self.exit(2, f"gpu_check: error: {message}\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="gpu_check", description="Check specchat on a CUDA machine.")
    parser.add_argument("--scale", action="store_true", help="the paper-scale check instead of the checks")
    parser.add_argument("--pair", action="store_true", help="the paper's pairs end to end instead of the checks")
    parser.add_argument("--dry-run", action="store_true", help="with --scale or --pair: shrunk widths, on any device")
    parser.add_argument("--layers", type=int, help=f"with --scale: target layers to build (more than {SLOTS})")
    parser.add_argument("--parts", help=f"with --scale: some of {','.join(PARTS)} (comma-separated; default all)")
    parser.add_argument("--only", choices=[pair.target for pair in PAIRS],
                        help="with --pair: this target's pair alone (one pair fits a 10-minute command)")
    parser.add_argument("--trace", type=Path, help="with --pair: one more reply at the first budget traced into this "
                        "folder (generate --trace), summed up per span and kernel")
    parser.add_argument("--budgets", help="with --pair: these budgets (comma-separated) instead of 1024,128,2048")
    parser.add_argument("--also", help="with --pair: each budget once more with these generate options (as one "
                        "quoted string, e.g. '--resident-layers 0'), its row beside, in no verdict")
    parser.add_argument("--trace-also", action="store_true", help="with --trace and --also: the traced reply "
                        "takes the --also options")
    options = parser.parse_args(argv)
    if options.scale and options.pair:
        parser.error("--scale and --pair are two checks: run one at a time")
    if options.dry_run and not (options.scale or options.pair):
        parser.error("--dry-run goes with --scale or --pair")
    if options.only is not None and not options.pair:
        parser.error("--only goes with --pair")
    if options.trace is not None and not options.pair:
        parser.error("--trace goes with --pair")
    if options.trace is not None and not options.trace.is_dir():
        parser.error(f"--trace {options.trace}: no such folder")
    if (options.budgets is not None or options.also is not None) and not options.pair:
        parser.error("--budgets and --also go with --pair")
    if options.budgets is not None:
        options.budgets = parse_budgets(parser, options.budgets)
    if options.trace_also and (options.trace is None or options.also is None):
        parser.error("--trace-also goes with --trace and --also")
    options.also = () if options.also is None else tuple(shlex.split(options.also))
    if options.layers is not None and not options.scale:
        parser.error("--layers goes with --scale")
    if options.layers is not None and options.layers <= SLOTS:
        parser.error(f"--layers must be more than the ring's {SLOTS} slots; got {options.layers}")
    if options.parts is not None and not options.scale:
        parser.error("--parts goes with --scale")
    options.parts = PARTS if options.parts is None else tuple(options.parts.split(","))
    unknown = [part for part in options.parts if part not in PARTS]
    if unknown:
        parser.error(f"--parts takes {', '.join(PARTS)}; got {', '.join(map(repr, unknown))}")
    return options


def parse_budgets(parser: argparse.ArgumentParser, text: str) -> tuple[int, ...]:
    try:
        budgets = tuple(int(word) for word in text.split(","))
    except ValueError:
        parser.error(f"--budgets takes whole numbers, comma-separated; got {text!r}")
    if any(budget < 1 for budget in budgets):
        parser.error(f"--budgets must be 1 or more; got {text!r}")
    return budgets


def main(argv: list[str]) -> int:
    options = parse(argv)
    # Loaded once the options are read: a mistyped one is answered before torch loads, and a machine
    # without a GPU before the checks do.
    import torch
    cuda = torch.cuda.is_available()
    if not cuda and not options.dry_run:
        print("no CUDA device visible to torch: nothing to check (this script is for GPU machines)")
        return 0
    from gpu_checks.dispatch import run
    return run(options, torch.device("cuda" if cuda else "cpu"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
