"""Time to first token and prefill tokens per turn of a 10-turn chat, with and without prefix reuse.

The conversation chains MT-Bench's two-turn questions (the first five questions, both turns:
ten user turns); each reply is the model's own, greedy, capped at --new-tokens, and is put back
in the history through the chat template as the app does. Each (engine, tier) runs the whole
conversation twice in the same process: "before" with the engine's PrefixCache switched off
(every turn prefills the whole history, as before issue 14) and "after" with reuse on.
--think-s waits that long before each question, as a user reading the reply and typing the next
one does; on an offloaded tier the loader stages the next pass in that time.

Usage: python scripts/bench_conversation.py --out DIR [--tiers memory,disk] [--new-tokens 24] [--think-s 0]
           [--modes before,after]
Writes DIR/rows.jsonl (one row per turn; refused if it exists) and prints a summary table.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path
from time import perf_counter, sleep

from specchat.bench.datasets import mtbench_questions
from specchat.decoding.events import SamplingParams
from specchat.decoding.prefix import common_prefix
from specchat.loader import load_models
from specchat.engine_options import EngineOptions

ENGINES = ("autoregressive", "specexec")
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, seed=0)


def questions(turns: int) -> list[str]:
    chained = [turn for question in mtbench_questions() for turn in question["turns"]]
    return chained[:turns]


def encode(tokenizer, messages: list[dict]) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


def converse(models, name: str, reuse: bool, asks: list[str], new_tokens: int, tier: str,
             think_s: float) -> list[dict]:
    engine = models.engine(name)
    engine.history.reuse = reuse
    messages, previous, rows = [], [], []
    for turn, question in enumerate(asks, 1):
        messages.append({"role": "user", "content": question})
        prompt = encode(models.tokenizer, messages)
        sleep(think_s)
        start, first, tokens, head = perf_counter(), None, [], None
        for event in engine.generate(prompt, new_tokens, GREEDY):
            if head is None:
                first, head = perf_counter() - start, event
            tokens += event.token_ids
        rows.append({
            "engine": name, "tier": tier, "reuse": reuse, "think_s": think_s, "turn": turn, "prompt_tokens": len(prompt),
            "new_prompt_tokens": len(prompt) - common_prefix(previous, prompt),
            "prefill_tokens": head.prefill_tokens, "prefill_s": round(head.prefill_s, 4),
            "ttft_s": round(first, 4), "reply_tokens": len(tokens), "reply_s": round(perf_counter() - start, 4),
            "reply_ids": tokens,
        })
        print({k: v for k, v in rows[-1].items() if k != "reply_ids"}, flush=True)
        previous = prompt + tokens
        messages.append({"role": "assistant", "content": models.tokenizer.decode(tokens, skip_special_tokens=True)})
    return rows


def summarize(rows: list[dict]) -> list[str]:
    lines = ["| engine | tier | reuse | TTFT turn 1 (s) | TTFT turn 10 (s) | turn 10 / turn 1 | prefill tokens turn 10 "
             "| new prompt tokens turn 10 | prefill tokens, turns 2-10 | new prompt tokens, turns 2-10 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["engine"], r["tier"], r["reuse"]) for r in rows}, key=lambda k: (k[1], k[0], k[2]))
    for engine, tier, reuse in keys:
        turns = [r for r in rows if (r["engine"], r["tier"], r["reuse"]) == (engine, tier, reuse)]
        first, last = turns[0], turns[-1]
        later = turns[1:]
        lines.append(
            f"| {engine} | {tier} | {'after' if reuse else 'before'} | {first['ttft_s']:.2f} | {last['ttft_s']:.2f} "
            f"| {last['ttft_s'] / first['ttft_s']:.2f} | {last['prefill_tokens']} | {last['new_prompt_tokens']} "
            f"| {sum(r['prefill_tokens'] for r in later)} | {sum(r['new_prompt_tokens'] for r in later)} |")
    return lines


def append_rows(path: Path, rows: list[dict]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiers", default="memory,disk")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--think-s", type=float, default=0.0, help="seconds before each question (a user typing)")
    parser.add_argument("--modes", default="before,after", help="before: no prefix reuse; after: reuse")
    parser.add_argument("--offload-dir", type=Path, default=None, help="the disk tier's layer file (default: a temp dir)")
    args = parser.parse_args()
    if not set(args.modes.split(",")) <= {"before", "after"}:
        parser.error(f"--modes takes before, after or both (got {args.modes})")
    if (args.out / "rows.jsonl").exists():  # checked before loading: rows kept are never replaced
        sys.exit(f"error: {args.out / 'rows.jsonl'} exists: measure into a fresh --out")
    args.out.mkdir(parents=True, exist_ok=True)
    asks = questions(args.turns)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specchat-bench-") as scratch:
        for tier in args.tiers.split(","):
            offload = {"memory": "none", "disk": "disk"}[tier]
            # the disk tier streams every decoder layer (none kept resident), as the paper's offloading regime
            options = EngineOptions(engine="specexec", dtype="bfloat16", offload=offload,
                                    offload_dir=str(args.offload_dir or scratch) if offload == "disk" else None,
                                    resident_layers=0 if offload == "disk" else None)
            models = load_models(options)
            try:
                for name in ENGINES:
                    for reuse in [{"before": False, "after": True}[mode] for mode in args.modes.split(",")]:
                        measured = converse(models, name, reuse, asks, args.new_tokens, tier, args.think_s)
                        append_rows(args.out / "rows.jsonl", measured)  # an interrupted run keeps what it measured
                        rows += measured
            finally:
                models.close()
    print("\n".join(summarize(rows)))


if __name__ == "__main__":
    main()
