"""`specchat ARGS...` with quant/q6k_linear.py's CHUNK_WEIGHTS set to argv[1] thousand-and-24s
(3072: the code before, 1024: after), every Q6Linear call timed; on exit it prints to stderr the
calls, their seconds and ms a call. Run: python variant.py 1024 generate ... --json"""
import atexit
import sys
import time

from specchat.quant import q6k_linear

q6k_linear.CHUNK_WEIGHTS = int(sys.argv.pop(1)) << 10
product = q6k_linear.Q6Linear.forward
calls = [0, 0.0]


def timed(self, x):
    start = time.perf_counter()
    out = product(self, x)
    calls[0] += 1
    calls[1] += time.perf_counter() - start
    return out


q6k_linear.Q6Linear.forward = timed
atexit.register(lambda: print(f"q6 calls {calls[0]} s {calls[1]:.3f} ms/call {1000 * calls[1] / max(1, calls[0]):.3f}",
                              file=sys.stderr))

from specchat.cli import main  # noqa: E402 (after the patch)

sys.argv = ["specchat", *sys.argv[1:]]
main()
