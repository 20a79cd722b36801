"""Load on `specchat serve`: concurrent streaming clients against one client sending the same
requests one after another, both against the same server in the same run.

Usage: python scripts/bench_serve.py [--clients 8] [--requests 3] [--max-tokens 32] [--out DIR] [-- SERVE ARGS]
Starts `specchat serve --port 0 SERVE ARGS` (the embedded pair unless told otherwise), waits for
its URL, runs both loads over MT-Bench first turns, prints a markdown table (queue wait p50 / p95,
latency p50, tokens/s, and the concurrent run's tokens/s over the sequential one's) and, with
--out, writes every request's row to DIR/rows.jsonl (refused if it exists: rows kept are never
replaced). Stops the server (Ctrl+C) at the end.
"""

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the load driver lives with the tests
from helpers.serve_load import figures, is_fifo, run_load  # noqa: E402

from specchat.bench.datasets import mtbench_first_turns  # noqa: E402


def start_server(serve_args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    with log.open("w") as err:
        server = subprocess.Popen([sys.executable, "-m", "specchat", "serve", "--port", "0", *serve_args],
                                  stdout=subprocess.PIPE, stderr=err, text=True)
    line = server.stdout.readline()
    if " at http" not in line:
        server.wait()
        sys.exit(f"the server did not start:\n{log.read_text()}")
    return server, line.split(" at ")[1].split(" ;")[0].removesuffix("/v1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=3, help="Requests per client, one after another.")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="Directory of rows.jsonl (every request of both runs).")
    parser.add_argument("serve_args", nargs="*", help="Options for `specchat serve` (after --).")
    args = parser.parse_args()
    if args.out and (args.out / "rows.jsonl").exists():  # checked before the server starts
        sys.exit(f"error: {args.out / 'rows.jsonl'} exists: measure into a fresh --out")
    total = args.clients * args.requests
    prompts = mtbench_first_turns(total)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:  # the server's log, removed after
        server, url = start_server(args.serve_args, Path(scratch) / "serve.log")
        try:
            model = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").models.list().data[0].id
            sequential, sequential_s = run_load(url, model, prompts, clients=1, requests=total,
                                                max_tokens=args.max_tokens)
            concurrent, concurrent_s = run_load(url, model, prompts, clients=args.clients, requests=args.requests,
                                                max_tokens=args.max_tokens)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=120)
    runs = {"sequential (1 client)": figures(sequential, sequential_s),
            f"concurrent ({args.clients} clients x {args.requests})": figures(concurrent, concurrent_s)}
    print(f"model {model}; {total} requests per run, {args.max_tokens} new tokens at most, MT-Bench first turns; "
          f"FIFO held: {is_fifo(concurrent)}; every stream whole: {len(concurrent) == total}")
    print("| run | requests | tokens | wall s | tokens/s | queue wait p50 s | queue wait p95 s | latency p50 s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in runs.items():
        print(f"| {name} | {row['requests']} | {row['tokens']} | {row['wall_s']:.1f} | {row['tokens_per_s']:.2f} | "
              f"{row['queue_p50_s']:.2f} | {row['queue_p95_s']:.2f} | {row['latency_p50_s']:.2f} |")
    ratio = runs[list(runs)[1]]["tokens_per_s"] / runs[list(runs)[0]]["tokens_per_s"]
    print(f"concurrent tokens/s over sequential: {ratio:.2f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "rows.jsonl").open("w") as rows:
            for run, records in (("sequential", sequential), ("concurrent", concurrent)):
                for record in records:
                    rows.write(json.dumps({"run": run, **asdict(record)}) + "\n")
        print(f"wrote {args.out / 'rows.jsonl'}", file=sys.stderr)


if __name__ == "__main__":
    main()
