"""Benchmark the disk tier: the real pair, the target's layers streamed from disk (O_DIRECT).

Usage: python scripts/bench_offload.py [--prompts 20] [--max-new-tokens 64] [--budgets 256]
           [--resident-layers 0] [--rows-dir docs/bench/offload-DATE] [--record docs/benchmarks.md]
           [--gptq] [--draft MODEL] [--draft-quant auto|none|int8]

In one run, on the same layer file: the raw O_DIRECT read speed of the layer file (one layer per
request, and coalesced requests as the streamer issues them), then autoregressive decoding and
SpecExec at each budget over the same prompts, with the streamed GB/s, the link idle fraction,
the stall fraction and tokens/s; the ratios issue 16 sets goals for (streamed / raw >= 0.90,
link idle < 10% during specexec, specexec >= 5x autoregressive tokens/s). Models load as the app
loads them (`runtime.load_models`, `--offload disk`); the draft is the app's default draft unless
--draft / --draft-quant say otherwise.
One raw row per (engine, budget, prompt) goes to --rows-dir/rows.jsonl, which must not exist yet
(kept rows are never replaced); the table to stdout (and --record). --gptq also compares the
bytes one pass moves with a 4-bit copy of the target.
"""

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from datetime import date
from pathlib import Path
from time import perf_counter

import torch

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.machine import describe_machine
from specchat.bench.provenance import code_version
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.models.loading import load, load_offloaded
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.offload.direct_io import DirectReader, align_up, aligned_empty, evict
from specchat.offload.storage import DiskStore
from specchat.offload.transport import COALESCE_BYTES
from specchat.paths import cache_dir
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.gptq import GPTQSpec
from specchat.loader import load_models
from specchat.engine_options import EngineOptions
from specchat.runtime import Models, encode_prompt
from specchat.summary import Summary, summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the GPTQ writer lives with the tests
from helpers.gptq_writer import write_gptq_checkpoint  # noqa: E402

COLUMNS = ("engine", "budget", "gen rate", "tokens/s", "draft ms / iter", "target ms / iter",
           "streamed GB/s", "link idle", "stall fraction", "GB / iter")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", default="256", help="comma list of tree sizes (or auto)")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resident-layers", type=int, default=0)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--draft-quant", default=EngineOptions.draft_quant)
    parser.add_argument("--offload-dir", type=Path, default=cache_dir() / "offload")
    parser.add_argument("--rows-dir", type=Path, default=Path(f"docs/bench/offload-{date.today().isoformat()}"))
    parser.add_argument("--gptq", action="store_true", help="also compare bytes per pass of a 4-bit copy")
    parser.add_argument("--record", help="append the results to this markdown file")
    return parser.parse_args()


def raw_read_gbps(store: DiskStore, layers: list[int], request_bytes: int | None) -> float:
    """Read the streamed layers' blobs once, uncached, with the streamer's reader: one layer per
    request (`request_bytes` None) or runs of consecutive layers up to `request_bytes`."""
    evict(store.path)
    sizes = {layer: align_up(store.nbytes(layer)) for layer in layers}
    buffers = {layer: aligned_empty(size) for layer, size in sizes.items()}
    runs = [[layer] for layer in layers] if request_bytes is None else coalesce(layers, sizes, request_bytes)
    with DirectReader(store.path) as reader:
        start = perf_counter()
        for run in runs:
            reader.read_many([buffers[layer] for layer in run], store.offsets[run[0]])
        seconds = perf_counter() - start
    return sum(sizes.values()) / seconds / 1e9


def coalesce(layers: list[int], sizes: dict[int, int], limit: int) -> list[list[int]]:
    runs: list[list[int]] = []
    for layer in layers:
        if runs and runs[-1][-1] == layer - 1 and sum(sizes[i] for i in runs[-1]) + sizes[layer] <= limit:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


def measure(models: Models, name: str, budget: int | str | None, prompts: list[list[int]], args,
            rows: Path, code: str) -> Summary:
    """Every prompt through the engine; a raw row per prompt (with the `code` that measured it);
    the summary over all of them."""
    engine = models.engine(name, LiveSettings(budget=budget))
    sampling = SamplingParams(args.temperature, args.top_p, args.seed)
    everything, total_wall = [], 0.0
    for index, prompt in enumerate(prompts):
        start = perf_counter()
        events = list(engine.generate(prompt, args.max_new_tokens, sampling))
        wall = perf_counter() - start
        everything += events
        total_wall += wall
        row = {"engine": name, "budget": budget, "prompt_index": index, "code": code,
               **asdict(summarize(events, wall)),
               "mean_tree_size": sum(e.tree_size for e in events) / len(events),
               "iterations_detail": [{k: getattr(e, k) for k in ("draft_s", "target_s", "transfer_s", "transfer_bytes",
                                                                  "stall_s", "link_idle", "tree_size")}
                                     for e in events]}
        with rows.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
    return summarize(everything, total_wall)


def warm_up(models: Models, budget: int | str, prompt: list[int]) -> None:
    """One short unrecorded run per engine, so one-time costs (allocations, kernel choice) land in no row."""
    for name, size in (("autoregressive", None), ("specexec", budget)):
        list(models.engine(name, LiveSettings(budget=size)).generate(prompt, 2, SamplingParams()))


def table_row(name: str, budget, s: Summary) -> str:
    values = [name, "-" if budget is None else str(budget), f"{s.gen_rate:.2f}", f"{s.tokens_per_s:.3f}",
              f"{1000 * s.draft_s / s.iterations:.0f}", f"{1000 * s.target_s / s.iterations:.0f}",
              f"{s.transfer_gbps:.2f}", f"{s.link_idle:.1%}", f"{s.stall_s / s.target_s:.2f}",
              f"{s.transfer_bytes / s.iterations / 1e9:.2f}"]
    return "| " + " | ".join(values) + " |"


def emit(line: str, args) -> None:
    print(line, flush=True)
    if args.record:  # line by line, so an interrupted run keeps what it measured
        with open(args.record, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def gptq_copy(args) -> Path:
    """A 4-bit copy of the target (RTN into the GPTQ format, group 128), written once."""
    directory = args.offload_dir / "qwen2.5-coder-1.5b-gptq-rtn-g128"
    if not (directory / "config.json").is_file():
        model = load(DEFAULT_TARGET, torch.float32).model
        write_gptq_checkpoint(model, directory, GPTQSpec(group_size=128))
        load(DEFAULT_TARGET, torch.float32).tokenizer.save_pretrained(directory)
    return directory


def compare_gptq(bf16_bytes: int, args) -> None:
    request = PlanRequest(tier="disk", offload_dir=args.offload_dir, resident_layers=args.resident_layers, slots=2)
    directory = gptq_copy(args)
    memory = plan_checkpoint(directory, directory.name, torch.bfloat16, Machine(kind="cpu"), request)
    _, quantized = load_offloaded(str(directory), torch.bfloat16, torch.device("cpu"), memory.placement,
                                  args.offload_dir, Reporter(bars=True))
    emit(f"\nBytes per target pass: bfloat16 {bf16_bytes / 1e9:.2f} GB, 4-bit GPTQ (g128) "
         f"{quantized.pass_bytes / 1e9:.2f} GB: {bf16_bytes / quantized.pass_bytes:.2f}x fewer.", args)
    quantized.close()


def main() -> None:
    args = parse_args()
    rows = args.rows_dir / "rows.jsonl"
    if rows.exists():  # checked before loading: a rerun must never replace rows already kept
        sys.exit(f"error: {rows} exists: measure into a fresh --rows-dir")
    budgets = [b if b == "auto" else int(b) for b in args.budgets.split(",")]
    options = EngineOptions(offload="disk", resident_layers=args.resident_layers, offload_dir=str(args.offload_dir),
                            dtype="bfloat16", budget=budgets[0], draft=args.draft, draft_quant=args.draft_quant)
    models = load_models(options, engines=("autoregressive",))
    code = code_version()
    try:
        offload = models.offload
        store = offload.store
        prompts = [encode_prompt(models.tokenizer, p, raw=False) for p in mtbench_first_turns(args.prompts)]
        per_layer = raw_read_gbps(store, offload.streamed, None)
        coalesced = raw_read_gbps(store, offload.streamed, COALESCE_BYTES)
        raw = max(per_layer, coalesced)
        args.rows_dir.mkdir(parents=True, exist_ok=True)
        emit(
            f"\n## Disk tier, {DEFAULT_TARGET} / {args.draft} (draft {models.identity['draft_quant']}), {date.today().isoformat()}\n\n"
            f"- Machine: {describe_machine()}\n- Code: {code}\n- Command: `python {shlex.join(sys.argv)}`\n"
            f"- {args.prompts} MT-Bench first turns x {args.max_new_tokens} new tokens, t={args.temperature}, "
            f"top-p={args.top_p}, bfloat16; O_DIRECT honoured: {store.reader.direct}; "
            f"plan: {offload.placement.describe()}\n"
            f"- Raw O_DIRECT read of the streamed layers: {per_layer:.2f} GB/s one layer per request, "
            f"{coalesced:.2f} GB/s in requests of up to {COALESCE_BYTES >> 20} MiB\n"
            f"- Raw rows: {rows}\n\n"
            f"| {' | '.join(COLUMNS)} |\n|{'---|' * len(COLUMNS)}", args,
        )
        warm_up(models, budgets[0], prompts[0])
        autoregressive = measure(models, "autoregressive", None, prompts, args, rows, code)
        emit(table_row("autoregressive", None, autoregressive), args)
        results = []
        for budget in budgets:
            summary = measure(models, "specexec", budget, prompts, args, rows, code)
            results.append((budget, summary))
            emit(table_row("specexec", budget, summary), args)
        emit("", args)
        for budget, s in results:
            emit(f"- specexec K={budget}: streamed / raw O_DIRECT {s.transfer_gbps / raw:.2f} (goal >= 0.90); "
                 f"link idle {s.link_idle:.1%} (goal < 10%); tokens/s {s.tokens_per_s / autoregressive.tokens_per_s:.2f}x "
                 f"autoregressive (goal >= 5x); per iteration {1000 * s.draft_s / s.iterations:.0f} ms drafting, "
                 f"{1000 * s.target_s / s.iterations:.0f} ms target pass of which "
                 f"{1000 * s.stall_s / s.iterations:.0f} ms waiting for layers", args)
        emit(f"- autoregressive: streamed / raw {autoregressive.transfer_gbps / raw:.2f}, stall fraction "
             f"{autoregressive.stall_s / autoregressive.target_s:.2f}", args)
        emit(f"- Raw O_DIRECT again after the runs: {raw_read_gbps(store, offload.streamed, COALESCE_BYTES):.2f} GB/s "
             f"(coalesced)", args)
        if args.gptq:
            compare_gptq(offload.pass_bytes, args)
    finally:
        models.close()


if __name__ == "__main__":
    main()
