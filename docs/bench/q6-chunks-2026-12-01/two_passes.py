"""Q6Weight.dequantize_into as committed beside the code before it (one multiply of the int8s by
the float32 scales), its file given as argv[2] (`git show f98677c:src/specchat/quant/q6k.py >
/tmp/q6k_before.py`), inside Q6Linear calls on random Q6_K blocks at 1 M-weight chunks,
alternated call by call: the median ms of each and their ratio, the outputs checked equal first.
Run from the checkout: python docs/bench/q6-chunks-2026-12-01/two_passes.py THREADS /tmp/q6k_before.py"""
import sys

import torch

sys.path.insert(0, "tests")
from alternate import module_from, seconds  # noqa: E402 (this folder: the script's own)
from helpers.q6_linears import q6_linear  # noqa: E402

from specchat.quant import q6k  # noqa: E402

SHAPES = [(1536, 8960), (256, 1536), (151936, 1536)]  # (out, in): down_proj, v_proj, the head
ROWS = [(1, False), (4, False), (16, True), (64, True)]  # widened to float32 from 8 rows


def main(threads: int, before_file: str) -> None:
    torch.set_num_threads(threads)
    before = module_from(before_file, "q6k_before")
    variants = {"old": before.Q6Weight.dequantize_into, "new": q6k.Q6Weight.dequantize_into}
    for out_features, in_features in SHAPES:
        linear, _ = q6_linear(out_features, in_features)
        for rows, widened in ROWS:
            linear.widened_from = 8 if widened else float("inf")
            x = torch.randn(rows, in_features).bfloat16()

            def run(name: str):
                q6k.Q6Weight.dequantize_into = variants[name]
                return linear(x)
            assert torch.equal(run("old"), run("new"))
            times = {name: [] for name in variants}
            for _ in range(20 if out_features < 10000 else 5):
                for name in variants:
                    times[name].append(seconds(lambda: run(name)))
            old, new = (1000 * sorted(times[name])[len(times[name]) // 2] for name in variants)
            print(out_features, in_features, rows, "widened" if widened else "bf16",
                  f"old {old:.2f} new {new:.2f} ({new / old:.2f}x)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
