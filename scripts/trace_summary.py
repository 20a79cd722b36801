"""A `specchat generate --trace` file summed up: per traced iteration, each span's (draft, pass,
verify) host ms, device computing ms, link copying ms and GB, device idle ms; then the kernels with
the most device time in each span, per iteration. On a GPU it says where an iteration's time goes:
a draft step's launches, a pass waiting on the link, or the link waiting on compute.

    specchat generate "..." --trace /tmp/reply.json.gz
    python scripts/trace_summary.py /tmp/reply.json.gz --kernels 12
"""

import argparse
import sys
from pathlib import Path

from specchat.trace_summary import read_trace, summarize_trace, summary_text

SPANS = ("draft", "pass", "verify")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="the Chrome trace generate --trace wrote (.json or .json.gz)")
    parser.add_argument("--kernels", type=int, default=10, help="kernels listed a span")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not args.trace.is_file():
        print(f"no trace at {args.trace}", file=sys.stderr)
        return 2
    events = read_trace(args.trace)
    if not summarize_trace(events):
        print(f"{args.trace} holds no specchat spans: a tree engine's iterations past the first "
              "three are traced (specexec, specinfer)", file=sys.stderr)
        return 1
    print(summary_text(events, SPANS, args.kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
