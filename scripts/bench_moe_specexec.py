"""Benchmark SpecExec end to end over a MoE target of real weights on the disk tier: the embedded
1.5B upcycled into a Qwen2-MoE, with the embedded 0.5B draft.

Usage: python scripts/bench_moe_specexec.py [--experts 8] [--top-k 2] [--workdir DIR] [--prompts 3]
           [--max-new-tokens 32] [--budgets auto] [--ram-budget 3] [--resident-layers N] [--temperature 0]
           [--modes "by expert,whole layers,by expert at share 0.9"] [--widths 1,4,16,64]
           [--rows-dir docs/bench/moe-specexec-DATE] [--record docs/benchmarks.md]

No MoE model ships on PyPI, and a random one defeats any draft. The target here is the 1.5B with
its MLP upcycled into --experts experts E, each the MLP less its own E-th of the channels, the rest
scaled by E / (E - 1), --top-k routed a token by a random router, normalized (tests/helpers/moe_upcycle.py;
RTN 4-bit GPTQ, group 128): the draft predicts it as it predicts the 1.5B, while routing spreads
tokens over experts that differ. The models load as the app loads them (`runtime.load_models`,
`--offload disk`) under --ram-budget, which by default keeps the experts from fitting in RAM;
--resident-layers as given or as the plan gives (with --resident-layers 0 and room, the plan's
expert cache holds the experts). For each mode
of streaming (by expert, the app's; whole layers, as before MoE streaming; by expert with whole
loads from 90% of a layer's experts routed, as before 2026-11-27):
- a pass over n tokens after a 64-token prefix for each n of --widths: seconds and bytes streamed
  (scripts/bench_moe_streaming.py's `time_passes`);
- autoregressive decoding and SpecExec at each budget over the same MT-Bench first turns: decode
  tokens/s (the prompt's pass excluded), gen rate, GB streamed an iteration; and, greedy, whether
  SpecExec's tokens are autoregressive decoding's, a difference judged by tests/helpers/exactness.py's
  near-tie rule under docs/exactness.md's bf16 bound (one bf16 step, 0.125 logits).
One raw row per (mode, engine, budget, prompt) or pass goes to --rows-dir/rows.jsonl (which must
not exist yet) as it is measured; the tables to stdout (and --record).
"""

import argparse
import dataclasses
import json
import sys
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import date
from functools import partial
from pathlib import Path
from time import perf_counter
from unittest import mock

from bench_moe_streaming import publish, time_passes

from specchat.bench.command import parse_budget_item, parse_list
from specchat.bench.datasets import mtbench_first_turns
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.errors import SpecchatError
from specchat.loader import load_models
from specchat.models import loading
from specchat.models.embedded import ensure_embedded
from specchat.models.registry import DEFAULT_TARGET
from specchat.offload import experts
from specchat.offload.build import offload_model
from specchat.engine_options import EngineOptions
from specchat.runtime import Models, encode_prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the upcycling writer lives with the tests
from helpers.exactness import ExactnessCheck  # noqa: E402
from helpers.moe_upcycle import write_upcycled  # noqa: E402

MODES = ("by expert", "whole layers")  # the default --modes
SHARE_BEFORE = "by expert at share 0.9"  # the wide-call rule before 2026-11-27
BF16_NEAR_TIE = 0.125  # docs/exactness.md: one bf16 step at logits 16-32 (tests/real/test_real_defaults.py)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/specchat-bench-moe-specexec"))
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--budgets", default="auto", help="comma list of tree sizes (or auto)")
    parser.add_argument("--ram-budget", type=float, default=3.0)
    parser.add_argument("--resident-layers", type=int)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--widths", default="1,4,16,64")
    parser.add_argument("--rows-dir", type=Path, default=Path(f"docs/bench/moe-specexec-{date.today().isoformat()}"))
    parser.add_argument("--record", help="append the results to this markdown file")
    return parser.parse_args()


@contextmanager
def streaming(mode: str, workdir: Path) -> Iterator[None]:
    """The app streams a MoE layer by expert; it has no switch for whole layers, nor for the share
    of its experts from which a call has the ring load whole layers (offload/experts.py), so the
    bench patches the loader's call to `offload_model`, or that share, for those modes. Each mode
    probes --budget auto's costs into a directory of its own: the probe's key does not tell them apart."""
    probes = {"SPECCHAT_PROBE_DIR": str(workdir / "probes" / mode.replace(" ", "-"))}
    patch = {"by expert": nullcontext(),
             "whole layers": mock.patch.object(loading, "offload_model", partial(offload_model, by_expert=False)),
             SHARE_BEFORE: mock.patch.object(experts, "WHOLE_SHARE", 0.9)}[mode]
    with mock.patch.dict(os.environ, probes), patch:
        yield


def decode(models: Models, engine: str, budget, prompt: list[int], args) -> tuple[list[int], dict]:
    """One reply: its tokens and a raw row (decode figures exclude the prompt's pass, events[0])."""
    sampling = SamplingParams(args.temperature, args.top_p, args.seed)
    start = perf_counter()
    events = list(models.engine(engine, LiveSettings(budget=budget)).generate(prompt, args.max_new_tokens, sampling))
    wall = perf_counter() - start
    replies = events[1:]
    row = {"engine": engine, "budget": budget, "wall_s": wall,
           "decode_tokens": sum(len(e.token_ids) for e in replies), "iterations": len(replies),
           "decode_s": sum(e.draft_s + e.target_s for e in replies),
           "draft_s": sum(e.draft_s for e in replies), "target_s": sum(e.target_s for e in replies),
           "streamed_bytes": sum(e.transfer_bytes for e in replies),
           "tree_sizes": [e.tree_size for e in replies]}
    return [t for e in events for t in e.token_ids], row


def judged(models: Models, prompt: list[int], reference: list[int], tokens: list[int], args) -> dict:
    """Greedy: how SpecExec's tokens compare with autoregressive decoding's (ties of at most one
    bf16 step, re-anchored, as tests/helpers/exactness.py judges them); sampled: nothing."""
    if args.temperature != 0:
        return {}
    check = ExactnessCheck(models.target, models.stop_ids, args.max_new_tokens, near_tie=BF16_NEAR_TIE,
                           max_ties=args.max_new_tokens)
    comparison = check.compare(prompt, reference, tokens, SamplingParams(0.0, 1.0, 0))
    return {"identical": comparison.identical, "near_ties_only": comparison.acceptable,
            "comparison": comparison.describe()}


def keep(rows: list[dict], row: dict, args) -> None:
    """Append `row`, to the rows file too: an interrupted run keeps what it measured."""
    rows.append(row)
    with (args.rows_dir / "rows.jsonl").open("a") as out:
        out.write(json.dumps(row) + "\n")


def run_mode(mode: str, directory: Path, budgets: list, args, rows: list[dict]) -> None:
    options = EngineOptions(target=str(directory), offload="disk", offload_dir=str(args.workdir / "offload"),
                            ram_budget=args.ram_budget, resident_layers=args.resident_layers, budget=budgets[0])
    with streaming(mode, args.workdir):
        run_engines(mode, load_models(options, engines=("autoregressive",)), budgets, args, rows)


def run_engines(mode: str, models: Models, budgets: list, args, rows: list[dict]) -> None:
    try:
        print(f"{mode}: plan {models.offload.placement.describe()}", flush=True)
        for row in time_passes(models.target, mode, [int(w) for w in args.widths.split(",")], 2):
            keep(rows, {"mode": mode, "what": "pass", **dataclasses.asdict(row)}, args)
        prompts = [encode_prompt(models.tokenizer, p, raw=False) for p in mtbench_first_turns(args.prompts)]
        list(models.engine("specexec", LiveSettings(budget=budgets[0])).generate(prompts[0], 2, SamplingParams()))
        for index, prompt in enumerate(prompts):
            reference, row = decode(models, "autoregressive", None, prompt, args)
            keep(rows, {"mode": mode, "what": "reply", "prompt": index, **row}, args)
            for budget in budgets:
                tokens, row = decode(models, "specexec", budget, prompt, args)
                comparison = judged(models, prompt, reference, tokens, args)
                keep(rows, {"mode": mode, "what": "reply", "prompt": index, **comparison, **row}, args)
                print(f"{mode}: prompt {index} specexec {budget}: {row['decode_tokens'] / row['decode_s']:.2f} tok/s, "
                      f"against autoregressive: {comparison.get('comparison', '-')}", flush=True)
    finally:
        models.close()


def tables(rows: list[dict]) -> str:
    passes = [r for r in rows if r["what"] == "pass"]
    lines = ["| streaming | pass over n tokens | GB streamed a pass | seconds a pass (fastest) |", "|---|---|---|---|"]
    for (mode, n), group in grouped(passes, ("mode", "tokens")).items():
        lines.append(f"| {mode} | {n} | {sum(r['streamed_bytes'] for r in group) / len(group) / 1e9:.2f} | "
                     f"{min(r['seconds'] for r in group):.2f} |")
    lines += ["", "| streaming | engine | decode tokens/s | gen rate | s an iteration (draft / target) | GB streamed "
              "an iteration | mean tree | greedy replies identical / near-ties only |",
              "|---|---|---|---|---|---|---|---|"]
    replies = [r for r in rows if r["what"] == "reply"]
    lines += [reply_row(key, group) for key, group in grouped(replies, ("mode", "engine", "budget")).items()]
    return "\n".join(lines)


def grouped(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """`rows` by the values of `keys`, in the order they first appear."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def reply_row(key: tuple, group: list[dict]) -> str:
    """One table row over one (mode, engine, budget)'s replies: decode figures summed over prompts."""
    mode, engine, budget = key
    tokens, seconds, iterations = (sum(r[k] for r in group) for k in ("decode_tokens", "decode_s", "iterations"))
    draft, target, streamed = (sum(r[k] for r in group) / iterations for k in ("draft_s", "target_s", "streamed_bytes"))
    trees = [size for r in group for size in r["tree_sizes"]]
    same = (f"{sum(r['identical'] for r in group)} / {sum(r['near_ties_only'] for r in group)} of {len(group)}"
            if "identical" in group[0] else "-")
    name = engine if budget is None else f"{engine} {budget}"
    return (f"| {mode} | {name} | {tokens / seconds:.3f} | {tokens / iterations:.2f} | {draft:.2f} / {target:.2f} | "
            f"{streamed / 1e9:.2f} | {sum(trees) / len(trees):.0f} | {same} |")


def main() -> None:
    args = parse_args()
    rows_file = args.rows_dir / "rows.jsonl"
    if rows_file.exists():
        sys.exit(f"error: {rows_file} exists: kept rows are never replaced; measure into a fresh --rows-dir")
    budgets = parse_budgets(args.budgets)
    modes = args.modes.split(",")
    if unknown := [mode for mode in modes if mode not in (*MODES, SHARE_BEFORE)]:
        sys.exit(f"error: no mode {unknown[0]!r}: --modes takes {', '.join((*MODES, SHARE_BEFORE))}")
    dense = ensure_embedded(DEFAULT_TARGET, progress=True)
    name = f"qwen2.5-coder-1.5b-moe-{args.experts}x-top{args.top_k}"
    print(f"writing {name} (upcycled from {dense.name}) in {args.workdir} ...", flush=True)
    directory = write_upcycled(dense, args.workdir / name, args.experts, args.top_k)
    rows: list[dict] = []
    args.rows_dir.mkdir(parents=True, exist_ok=True)
    for mode in modes:
        run_mode(mode, directory, budgets, args, rows)
    publish(tables(rows), args.record)


def parse_budgets(text: str) -> list[int | str]:
    """--budgets' tree sizes (or auto) as `specchat bench` reads them, checked before anything loads."""
    try:
        return parse_list(text, "--budgets", parse_budget_item)
    except SpecchatError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
