"""Benchmark the offloaded target: the real pair, target layers streamed from disk (O_DIRECT).

Usage: python scripts/bench_offload.py [--prompts 5] [--max-new-tokens 32] [--budgets 64,256,1024]
           [--resident-layers 0] [--slots 4] [--gptq] [--record docs/benchmarks.md]
Reports the layer file's raw O_DIRECT read GB/s, the streaming throughput and stall fraction
during decoding, and tokens/s of autoregressive decoding and of SpecExec at each budget, all on
the same storage; --gptq also writes a 4-bit (RTN, GPTQ format) copy of the target and compares
the bytes one target pass moves.
"""

import argparse
import shlex
import sys
from datetime import date
from pathlib import Path

import torch

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.machine import describe_machine
from specchat.bench.measure import run_prompts
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.drafter import TreeShape
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SpecExecEngine
from specchat.decoding.stopping import stop_token_ids
from specchat.models.loading import load, load_offloaded
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.offload.build import Offload, OffloadPlan
from specchat.offload.direct_io import measure_read_gbps
from specchat.paths import cache_dir
from specchat.progress import Reporter
from specchat.quant.gptq import GPTQSpec
from specchat.runtime import encode_prompt
from specchat.summary import summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the GPTQ writer lives with the tests
from gptq_writer import write_gptq_checkpoint  # noqa: E402

COLUMNS = ("engine", "budget", "gen rate", "tokens/s", "draft ms / iter", "target ms / iter",
           "streamed GB/s", "stall fraction", "GB / iter")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--budgets", default="64,256,1024")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resident-layers", type=int, default=0)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--offload-dir", type=Path, default=cache_dir() / "offload")
    parser.add_argument("--gptq", action="store_true", help="also compare bytes per pass of a 4-bit copy")
    parser.add_argument("--record", help="append the results to this markdown file")
    return parser.parse_args()


def measure(engine, prompts: list[list[int]], args) -> dict:
    """Every prompt through `engine`; figures over all iterations of all prompts."""
    sampling = SamplingParams(args.temperature, args.top_p, args.seed)
    events, wall = run_prompts(engine, prompts, args.max_new_tokens, sampling)
    s = summarize(events, wall)
    return {
        "gen rate": s.gen_rate,
        "tokens/s": s.tokens_per_s,
        "draft ms / iter": 1000 * s.draft_s / s.iterations,
        "target ms / iter": 1000 * s.target_s / s.iterations,
        "streamed GB/s": s.transfer_gbps,
        "stall fraction": s.stall_s / s.target_s,
        "GB / iter": s.transfer_bytes / s.iterations / 1e9,
    }


def row(values: dict) -> str:
    cells = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in (values[c] for c in COLUMNS)]
    return "| " + " | ".join(cells) + " |"


def emit(line: str, args) -> None:
    print(line, flush=True)
    if args.record:  # line by line, so an interrupted run keeps what it measured
        with open(args.record, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def load_target(spec: str, args) -> tuple[CausalLM, Offload]:
    plan = OffloadPlan(tier="disk", offload_dir=args.offload_dir, resident_layers=args.resident_layers,
                       slots=args.slots)
    target, offload = load_offloaded(spec, torch.bfloat16, torch.device("cpu"), plan, Reporter(bars=True))
    return CausalLM(target.model, offload), offload


def measure_raw_gbps(offload: Offload) -> float:
    """Sequential O_DIRECT read of the whole layer file, no compute, with the reader the streamer
    uses (256 MiB requests, split into its parallel chunks)."""
    return measure_read_gbps(offload.store.path, block_bytes=256 * 2**20)


def gptq_copy(args) -> Path:
    """A 4-bit copy of the target (RTN into the GPTQ format, group 128), written once."""
    directory = args.offload_dir / "qwen2.5-coder-1.5b-gptq-rtn-g128"
    if not (directory / "config.json").is_file():
        model = load(DEFAULT_TARGET, torch.float32).model
        write_gptq_checkpoint(model, directory, GPTQSpec(group_size=128))
        load(DEFAULT_TARGET, torch.float32).tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    args = parse_args()
    draft = load(DEFAULT_DRAFT, torch.bfloat16)
    target, offload = load_target(DEFAULT_TARGET, args)
    stops = stop_token_ids(target.model, draft.tokenizer)
    prompts = [encode_prompt(draft.tokenizer, p, raw=False) for p in mtbench_first_turns(args.prompts)]
    raw = measure_raw_gbps(offload)
    emit(
        f"\n## Offloaded target on the disk tier, {DEFAULT_TARGET} / {DEFAULT_DRAFT}, {date.today().isoformat()}\n\n"
        f"- Machine: {describe_machine()}\n- Command: `python {shlex.join(sys.argv)}`\n"
        f"- {args.prompts} MT-Bench first turns x {args.max_new_tokens} new tokens, t={args.temperature}, "
        f"top-p={args.top_p}, bfloat16; target layers streamed with O_DIRECT "
        f"(O_DIRECT honoured: {offload.store.reader.direct}), {offload.streamed[0]} resident, "
        f"{len(offload.streamed)} streamed, ring of {args.slots} slots; draft in memory\n"
        f"- Streamed per pass {offload.pass_bytes / 1e9:.2f} GB; raw O_DIRECT sequential read of it: {raw:.2f} GB/s\n\n"
        f"| {' | '.join(COLUMNS)} |\n|{'---|' * len(COLUMNS)}", args,
    )
    autoregressive = AutoregressiveEngine(target, stops)
    emit(row({"engine": "autoregressive", "budget": "-", **measure(autoregressive, prompts, args)}), args)
    specexec = SpecExecEngine(target, CausalLM(draft.model), stops, TreeShape(budget=16))
    for budget in (int(b) for b in args.budgets.split(",")):
        specexec.apply(LiveSettings(budget=budget))
        emit(row({"engine": "specexec", "budget": budget, **measure(specexec, prompts, args)}), args)
    emit(f"\nRaw O_DIRECT read of the layer file again after the runs: {measure_raw_gbps(offload):.2f} GB/s.", args)
    if args.gptq:
        bf16_bytes = offload.pass_bytes
        offload.close()
        _, quantized = load_target(str(gptq_copy(args)), args)
        ratio = bf16_bytes / quantized.pass_bytes
        emit(f"\nBytes per target pass: bfloat16 {bf16_bytes / 1e9:.2f} GB, 4-bit GPTQ (g128) "
             f"{quantized.pass_bytes / 1e9:.2f} GB: {ratio:.2f}x fewer.", args)
        quantized.close()
    else:
        offload.close()


if __name__ == "__main__":
    main()
