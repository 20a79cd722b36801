"""Q6Linear.forward on float32 inputs as committed (the expansion is the weight) beside the code
before it (expanded, then copied into a float32 weight), its file given as argv[2] (`git show
8c2e334:src/specchat/quant/q6k_linear.py > /tmp/q6k_linear_before.py`), on random Q6_K blocks,
alternated call by call: the median ms of each and their ratio, the outputs checked equal first.
Run from the checkout: python docs/bench/q6-chunks-2026-12-01/float32_alias.py THREADS /tmp/q6k_linear_before.py"""
import sys

import torch

sys.path.insert(0, "tests")
from alternate import module_from, seconds  # noqa: E402 (this folder: the script's own)
from helpers.q6_linears import q6_linear  # noqa: E402

SHAPES = [(1536, 8960), (256, 1536), (151936, 1536)]  # (out, in): down_proj, v_proj, the head
ROWS = [1, 4, 16, 64]


def main(threads: int, before_file: str) -> None:
    torch.set_num_threads(threads)
    before = module_from(before_file, "q6k_linear_before")
    for out_features, in_features in SHAPES:
        linear, _ = q6_linear(out_features, in_features)
        for rows in ROWS:
            x = torch.randn(rows, in_features)
            variants = {"old": lambda: before.Q6Linear.forward(linear, x), "new": lambda: linear(x)}
            assert torch.equal(variants["old"](), variants["new"]())
            times = {name: [] for name in variants}
            for _ in range(20 if out_features < 10000 else 5):
                for name, call in variants.items():
                    times[name].append(seconds(call))
            old, new = (1000 * sorted(times[name])[len(times[name]) // 2] for name in variants)
            print(out_features, in_features, rows, "float32", f"old {old:.2f} new {new:.2f} ({new / old:.2f}x)",
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
