"""One Q6Linear over random Q6_K blocks per shape (the 1.5B's down_proj, v_proj and head), timed
at 1 and 4 rows (bf16) and 16 and 64 rows (widened to float32 from 8) with CHUNK_WEIGHTS at each
size given, the sizes alternated call by call; the median ms of each. Run from the checkout:
python docs/bench/q6-chunks-2026-12-01/chunks.py THREADS 1048576,3145728"""
import sys

import torch

sys.path.insert(0, "tests")
from alternate import seconds  # noqa: E402 (this folder: the script's own)
from helpers.q6_linears import q6_linear  # noqa: E402

from specchat.quant import q6k_linear  # noqa: E402

SHAPES = [(1536, 8960), (256, 1536), (151936, 1536)]  # (out, in)
ROWS = [(1, False), (4, False), (16, True), (64, True)]


def main(threads: int, chunks: list[int]) -> None:
    torch.set_num_threads(threads)
    for out_features, in_features in SHAPES:
        linear, _ = q6_linear(out_features, in_features)
        for rows, widened in ROWS:
            linear.widened_from = 8 if widened else float("inf")
            x = torch.randn(rows, in_features).to(torch.bfloat16)

            def call(chunk: int):
                q6k_linear.CHUNK_WEIGHTS = chunk
                return linear(x)
            times = {chunk: [] for chunk in chunks}
            for chunk in chunks:
                call(chunk)
            for _ in range(20 if out_features < 10000 else 5):
                for chunk in chunks:
                    times[chunk].append(seconds(lambda: call(chunk)))
            medians = " ".join(f"{chunk >> 10}K:{1000 * sorted(t)[len(t) // 2]:.2f}" for chunk, t in times.items())
            print(out_features, in_features, rows, "widened" if widened else "bf16", medians, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(c) for c in sys.argv[2].split(",")])
