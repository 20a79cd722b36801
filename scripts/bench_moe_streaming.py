"""Benchmark a MoE target streamed by expert against the same target streamed as whole layers.

Usage: python scripts/bench_moe_streaming.py [--alias qwen3-30b-a3b-gptq] [--layers 48]
           [--workdir DIR] [--widths 1,4,16,64] [--tokens 8] [--repeats 2]
           [--rows-dir docs/bench/moe-DATE] [--record docs/benchmarks.md]

No MoE model ships on PyPI, so the target is the alias's config with random 4-bit GPTQ weights
(tests/gpu_checks/scale_models.py: every expert's linears written one by one, as AutoGPTQ stores
them), all its layers on the disk tier (the layer file read with O_DIRECT, nothing resident,
a 2-slot ring). In one run, on one layer file, for each way of streaming (by expert, every call
fetching; whole layers; by expert with whole layers after calls that routed to 90% of their
experts; the default: that, with the expert cache the plan gives the RAM left):
- a pass over n tokens after a 64-token prefix, for each n of --widths: its seconds and the bytes
  it streamed (the ring's loads and the experts fetched), the fastest and the mean of --repeats;
- autoregressive greedy decoding of --tokens tokens: tokens/s.
Random weights route tokens near uniformly, as the plan's E(1 - (1 - k/E)^n) assumes; a real
model's routing is more skewed (fewer distinct experts). A draft cannot predict a random target,
so SpecExec is not run end to end: the table gives what a pass of each width costs, which is
what a tree of that width costs the target, and the tokens/s a gen rate g would give over it
(g / pass seconds), labelled as arithmetic. One raw row per (mode, what, n, repeat) goes to
--rows-dir/rows.jsonl (which must not exist yet); the table to stdout (and --record).
"""

import argparse
import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from statistics import fmean
from time import perf_counter

import torch

from specchat.bench.machine import describe_machine
from specchat.bench.provenance import code_version
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.offload.build import offload_model
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the random GPTQ writer lives with the checks
from gpu_checks.scale_models import alias_config, write_random_4bit  # noqa: E402

PREFIX = 64  # tokens cached before a timed pass
GEN_RATES = (2.8, 12.38)  # this machine's dense pair at --budget auto (docs/benchmarks.md); the paper's Mixtral rate
DTYPE = torch.bfloat16
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, seed=0)
# mode -> (by_expert, whole_loads, the plan's expert cache kept): every call fetching from the disk;
# whole layers; by expert with whole layers after calls that routed to 90% of their experts
# (offload/experts.py), without the cache; the default: that, with the cache the plan gives the RAM left
MODES = {"by expert": (True, False, False), "whole layers": (False, False, False),
         "wide calls whole": (True, True, False), "default": (True, True, True)}


@dataclass(frozen=True)
class Row:
    mode: str
    what: str  # "pass" or "decode"
    tokens: int  # the pass's width, or the tokens decoded
    repeat: int
    seconds: float
    streamed_bytes: int
    fetched_bytes: int


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alias", default="qwen3-30b-a3b-gptq")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/specchat-bench-moe"))
    parser.add_argument("--widths", default="1,4,16,64")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows-dir", type=Path, default=Path(f"docs/bench/moe-{date.today().isoformat()}"))
    parser.add_argument("--record", help="append the results to this markdown file")
    return parser.parse_args()


def offloaded(directory: Path, workdir: Path, by_expert: bool, whole_loads: bool, cached: bool):
    """The target with every layer on the disk tier through a 2-slot ring, as `offload_model` builds
    it; the plan's expert cache in RAM if `cached`."""
    request = PlanRequest(tier="disk", offload_dir=workdir / "offload", resident_layers=0, slots=2)
    planned = plan_checkpoint(directory, directory.name, DTYPE, Machine(kind="cpu"), request).placement
    placement = planned if cached else dataclasses.replace(planned, expert_cache=0)
    model, offload = offload_model(directory, directory.name, DTYPE, torch.device("cpu"), placement,
                                   request.offload_dir, Reporter(bars=True), by_expert=by_expert,
                                   whole_loads=whole_loads)
    return CausalLM(model, offload), offload


def time_passes(lm: CausalLM, mode: str, widths: list[int], repeats: int) -> list[Row]:
    vocab, rows = lm.model.config.vocab_size, []
    generator = torch.Generator().manual_seed(0)
    for n in widths:
        for repeat in range(repeats):
            cache = new_cache()
            lm.hidden(torch.randint(0, vocab, (PREFIX,), generator=generator), torch.arange(PREFIX), cache)
            tokens = torch.randint(0, vocab, (n,), generator=generator)
            before, start = lm.transfer_stats(), perf_counter()
            lm.hidden(tokens, torch.arange(PREFIX, PREFIX + n), cache)  # causal over n: as a chain-shaped tree
            moved = lm.transfer_stats() - before
            rows.append(Row(mode, "pass", n, repeat, perf_counter() - start, moved.bytes, moved.fetched_bytes))
            print(f"{mode}: pass over {n} tokens {rows[-1].seconds:.2f} s, {moved.bytes / 1e9:.2f} GB", flush=True)
    return rows


def time_decode(lm: CausalLM, mode: str, tokens: int) -> Row:
    prompt = list(range(1, PREFIX + 1))
    events = AutoregressiveEngine(lm, []).generate(prompt, 1, GREEDY)
    list(events)  # the prompt's pass, not timed
    before, start = lm.transfer_stats(), perf_counter()
    list(AutoregressiveEngine(lm, []).generate(prompt, tokens + 1, GREEDY))
    seconds, moved = perf_counter() - start, lm.transfer_stats() - before
    print(f"{mode}: {tokens} tokens decoded in {seconds:.1f} s", flush=True)
    return Row(mode, "decode", tokens, 0, seconds, moved.bytes, moved.fetched_bytes)


def table(rows: list[Row]) -> str:
    lines = ["| streaming | pass over n tokens | GB streamed a pass | of which experts fetched | seconds a pass (fastest / mean) "
             f"| tokens/s at gen rate {' / '.join(f'{g:g}' for g in GEN_RATES)} (arithmetic) |",
             "|---|---|---|---|---|---|"]
    for mode in MODES:
        for n in sorted({r.tokens for r in rows if r.what == "pass"}):
            group = [r for r in rows if (r.mode, r.what, r.tokens) == (mode, "pass", n)]
            fastest = min(r.seconds for r in group)
            speeds = " / ".join(f"{g / fastest:.2f}" for g in GEN_RATES)
            lines.append(f"| {mode} | {n} | {fmean(r.streamed_bytes for r in group) / 1e9:.2f} | "
                         f"{fmean(r.fetched_bytes for r in group) / 1e9:.2f} | {fastest:.2f} / "
                         f"{fmean(r.seconds for r in group):.2f} | {speeds} |")
    decode = {r.mode: r for r in rows if r.what == "decode"}
    lines += ["", "| streaming | autoregressive tokens/s | GB streamed a token |", "|---|---|---|"]
    lines += [f"| {mode} | {r.tokens / r.seconds:.3f} | {r.streamed_bytes / r.tokens / 1e9:.2f} |" for mode, r in decode.items()]
    if "whole layers" in decode:
        whole = decode["whole layers"].tokens / decode["whole layers"].seconds
        lines += [f"\nautoregressive decoding {mode} / whole layers: {r.tokens / r.seconds / whole:.2f}x"
                  for mode, r in decode.items() if mode != "whole layers"]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    rows_file = args.rows_dir / "rows.jsonl"
    if rows_file.exists():
        sys.exit(f"error: {rows_file} exists: kept rows are never replaced; measure into a fresh --rows-dir")
    widths = [int(w) for w in args.widths.split(",")]
    config, settings = alias_config(args.alias, args.layers, {})
    print(f"writing a random 4-bit {args.alias} of {args.layers} layers in {args.workdir} ...", flush=True)
    directory = write_random_4bit(config, settings, args.workdir / f"{args.alias}-{args.layers}")
    rows: list[Row] = []
    for mode, (by_expert, whole_loads, cached) in MODES.items():
        lm, offload = offloaded(directory, args.workdir, by_expert, whole_loads, cached)
        try:
            rows += time_passes(lm, mode, widths, args.repeats)
            rows.append(time_decode(lm, mode, args.tokens))
        finally:
            offload.close()
    args.rows_dir.mkdir(parents=True, exist_ok=True)
    rows_file.write_text("".join(json.dumps(row.__dict__) + "\n" for row in rows))
    publish(table(rows), args.record)


def publish(tables: str, record: str | None) -> None:
    """Print `tables` under the date, the machine, the code and the command; append them to the
    markdown file `record` if given."""
    report = (f"{date.today().isoformat()}, {describe_machine()}, code {code_version()}\n"
              f"command: python {shlex.join(sys.argv)}\n\n{tables}")
    print(report)
    if record:
        with open(record, "a") as out:
            out.write("\n" + report + "\n")


if __name__ == "__main__":
    main()
