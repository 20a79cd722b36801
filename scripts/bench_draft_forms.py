"""Time a draft's step in each form `--draft-quant` offers, as the plan measures it before it
weighs the forms (models/draft_step.py: four of the draft's layers with random weights, scaled to
all of them; the head and embedding left out), at several step widths, on this machine's device.

Usage: python scripts/bench_draft_forms.py [--draft ALIAS] [--widths 1,16,43,256]
Prints one markdown row per width: ms a step for full weights, int8 (on a CPU) and int4, and each
form's ratio to full weights measured in the same run. Nothing is kept (the plan's own
measurements are, in the probe directory).
"""

import argparse

import torch

from specchat.models.configs import read_config
from specchat.models.draft import DraftQuant
from specchat.models.draft_step import measure_step
from specchat.models.registry import DEFAULT_DRAFT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--widths", default="1,16,43,256")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kinds = ("none", "int8", "int4") if device.type == "cpu" else ("none", "int4")  # int8's kernels are a CPU's
    config = read_config(args.draft)
    print(f"{args.draft} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'the CPU'}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, bf16")
    print("| tokens a step | " + " | ".join(f"{kind} ms" for kind in kinds) + " | " +
          " | ".join(f"{kind} / none" for kind in kinds[1:]) + " |")
    print("|---" * (2 * len(kinds)) + "|")
    for width in (int(w) for w in args.widths.split(",")):
        ms = [1000 * measure_step(config, DraftQuant(kind), torch.bfloat16, device, width)[1] for kind in kinds]
        print(f"| {width} | " + " | ".join(f"{m:.1f}" for m in ms) + " | " +
              " | ".join(f"{m / ms[0]:.2f}x" for m in ms[1:]) + " |")


if __name__ == "__main__":
    main()
