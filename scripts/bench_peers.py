"""specchat against its peers, in one run, in memory: transformers `generate` (the target alone),
transformers assisted generation (the same draft), specchat autoregressive, and specchat
specexec at `--budget auto` and at fixed budgets.

Usage: python scripts/bench_peers.py --out DIR [--prompts 20] [--max-new-tokens 64]
           [--temperatures 0,0.6] [--top-p 0.9] [--budgets auto,8,16,64] [--dtype bfloat16]
           [--offload none|disk] [--systems hf-generate,hf-assisted,autoregressive,specexec]

Every system runs on every prompt before the next prompt starts, so drift in the machine's
speed touches all systems alike; ratios are taken within this run. DIR must be new or empty: it
receives one JSON row per (prompt, system, temperature) in results.jsonl, and the table in
table.md. Figures are pooled over the prompts: tokens/s = all new tokens / all wall seconds;
gen rate = all new tokens / all target passes (the prompt's pass is one of them, and
emits the first token, as every specchat engine but dsi reports it).
"""

import argparse
import json
import sys
from functools import cache
from pathlib import Path
from time import perf_counter

import torch

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.measure import measure_engine, measure_hf_assisted, plain_draft
from specchat.bench.provenance import claim_fresh_folder, code_version, table_header
from specchat.decoding.events import AUTO, LiveSettings, SamplingParams
from specchat.loader import load_models
from specchat.engine_options import EngineOptions
from specchat.runtime import Models, encode_prompt

HF_SYSTEMS = ("hf-generate", "hf-assisted")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budgets", default="auto,8,16,64")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--offload", default="none", choices=("none", "ram", "disk"))
    parser.add_argument("--resident-layers", type=int, default=None)
    parser.add_argument("--systems", default="hf-generate,hf-assisted,autoregressive,specexec")
    return parser.parse_args()


def system_names(args: argparse.Namespace) -> list[str]:
    """hf-generate, hf-assisted, autoregressive and specexec-<budget> for each budget, as asked."""
    names = []
    for system in args.systems.split(","):
        if system == "specexec":
            names += [f"specexec-{budget}" for budget in args.budgets.split(",")]
        else:
            names.append(system)
    return names


def measure_hf_generate(models: Models, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> dict:
    """transformers' own decoding loop over the target alone."""
    target = models.target.model
    greedy = sampling.temperature == 0
    options = {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
    torch.manual_seed(sampling.seed)
    start = perf_counter()
    out = target.generate(torch.tensor([prompt_ids], device=target.device), max_new_tokens=max_new_tokens,
                          do_sample=not greedy, repetition_penalty=1.0, eos_token_id=sorted(models.stop_ids),
                          pad_token_id=models.tokenizer.pad_token_id, **options)
    wall_s = perf_counter() - start
    new_tokens = out.shape[1] - len(prompt_ids)
    return {"new_tokens": new_tokens, "wall_s": wall_s, "tokens_per_s": new_tokens / wall_s}


@cache
def peer_draft(spec: str, dtype: str, device: torch.device) -> torch.nn.Module:
    """transformers' assisted generation gets the draft as its checkpoint holds it, loaded once."""
    return plain_draft(spec, dtype, device)


def measure_system(models: Models, system: str, prompt_ids: list[int], max_new_tokens: int,
                   sampling: SamplingParams) -> dict:
    if system == "hf-generate":
        return measure_hf_generate(models, prompt_ids, max_new_tokens, sampling)
    if system == "hf-assisted":
        draft = peer_draft(models.identity["draft"], models.identity["dtype"], models.device)
        return measure_hf_assisted(models.target.model, draft, prompt_ids, max_new_tokens, sampling, models.stop_ids,
                                   models.tokenizer.pad_token_id)
    if system == "autoregressive":
        engine = models.engine("autoregressive")
    else:
        budget = system.removeprefix("specexec-")
        engine = models.engine("specexec", LiveSettings(budget=AUTO if budget == AUTO else int(budget)))
    return measure_engine(engine, prompt_ids, max_new_tokens, sampling)


def pooled(rows: list[dict]) -> dict:
    tokens = sum(row["new_tokens"] for row in rows)
    wall = sum(row["wall_s"] for row in rows)
    passes = sum(row.get("iterations") or 0 for row in rows)
    drafted = [row for row in rows if row.get("iterations")]
    return {
        "tokens_per_s": tokens / wall,
        "gen_rate": tokens / passes if passes else None,
        "draft_ms": 1000 * sum(row["draft_s"] for row in drafted) / passes if passes else None,
        "target_ms": 1000 * sum(row["target_s"] for row in drafted) / passes if passes else None,
        "mean_tree": (sum(row["mean_tree_size"] * row["trees"] for row in drafted) / sum(row["trees"] for row in drafted)
                      if any(row["trees"] for row in drafted) else None),
    }


def table(rows: list[dict], systems: list[str], temperatures: list[float]) -> str:
    lines = ["| temperature | system | tokens/s | vs autoregressive | vs hf-assisted | gen rate | draft ms / iter "
             "| target ms / iter | mean tree |", "|---|---|---|---|---|---|---|---|---|"]
    show = lambda value, spec: "-" if value is None else format(value, spec)  # noqa: E731
    for temperature in temperatures:
        at = {s: pooled([r for r in rows if r["system"] == s and r["temperature"] == temperature]) for s in systems}
        for system in systems:
            figures = at[system]
            versus = lambda base: (f"{figures['tokens_per_s'] / at[base]['tokens_per_s']:.2f}x"  # noqa: E731
                                   if base in at else "-")
            lines.append(f"| {temperature:g} | {system} | {figures['tokens_per_s']:.2f} | {versus('autoregressive')} | "
                         f"{versus('hf-assisted')} | {show(figures['gen_rate'], '.2f')} | "
                         f"{show(figures['draft_ms'], '.0f')} | {show(figures['target_ms'], '.0f')} | "
                         f"{show(figures['mean_tree'], '.1f')} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    claim_fresh_folder(args.out)
    systems = system_names(args)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    budget = AUTO if any(s == f"specexec-{AUTO}" for s in systems) else None
    models = load_models(EngineOptions(budget=budget, dtype=args.dtype, offload=args.offload,
                                       resident_layers=args.resident_layers), engines=("autoregressive",))
    tokenizer = models.tokenizer
    prompts = [encode_prompt(tokenizer, text, raw=False) for text in mtbench_first_turns(args.prompts)]
    version = code_version()
    results = args.out / "results.jsonl"
    rows = []
    for temperature in temperatures:
        sampling = SamplingParams(temperature, args.top_p, args.seed)
        for system in systems:  # warm-up: first-call allocations and lazy initialisation
            measure_system(models, system, prompts[0], 4, sampling)
        for index, prompt_ids in enumerate(prompts):
            for system in systems:
                row = {"system": system, "temperature": temperature, "top_p": args.top_p, "seed": args.seed,
                       "prompt_index": index, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
                       "offload": args.offload, "code": version,
                       **measure_system(models, system, prompt_ids, args.max_new_tokens, sampling)}
                rows.append(row)
                with results.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row) + "\n")
                print(f"t={temperature:g} prompt {index} {system}: {row['tokens_per_s']:.2f} tok/s",
                      file=sys.stderr, flush=True)
    text = table(rows, systems, temperatures)
    (args.out / "table.md").write_text(f"{table_header(version)}\n\n{text}\n", encoding="utf-8")
    print(text)
    models.close()


if __name__ == "__main__":
    main()
