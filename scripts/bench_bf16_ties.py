"""How many bf16 near-ties a reply of the shipped defaults holds, with the dense copies for tree
passes (quant/int4_dense.py) and without them: the measurement behind tests/real/test_real_defaults.py's
per-reply bounds.

The defaults (bf16, `--budget auto`, the packed target, the draft as auto resolves it) run
specexec on MT-Bench first turns, greedy and seeded (t=0.6, top-p 0.9, the default seed), against
bf16 autoregressive decoding of the same target; tests/helpers/exactness.py's check counts every near-tie
(within BF16_NEAR_TIE logits: the reference re-anchors on the engine's token and goes on) and fails
on any other difference. Each reply runs twice: with the copies the plan kept, and with every copy
dropped (tree rows then run the fused kernel, whose rows are those of a one-token pass).

Usage: python scripts/bench_bf16_ties.py --out DIR [--prompts 10] [--max-new-tokens 32]
DIR must be new or empty: it receives results.jsonl (one row per prompt, sampling and variant)
and table.md.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checker lives with the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "real"))  # the real pair's test modules
from helpers.exactness import ExactnessCheck  # noqa: E402
from test_real_defaults import BF16_NEAR_TIE  # noqa: E402

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.provenance import claim_fresh_folder, code_version, table_header
from specchat.decoding.events import SamplingParams
from specchat.limits import DEFAULT_SEED, DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from specchat.loader import load_models
from specchat.quant.int4 import Int4Linear
from specchat.engine_options import EngineOptions
from specchat.runtime import encode_prompt

SAMPLINGS = {"greedy": SamplingParams(0.0), "seeded": SamplingParams(DEFAULT_TEMPERATURE, DEFAULT_TOP_P, DEFAULT_SEED)}
UNBOUNDED = 10**6  # count every tie; the bound is what this measures


def tokens(engine, prompt_ids: list[int], count: int, sampling: SamplingParams) -> list[int]:
    return [t for event in engine.generate(prompt_ids, count, sampling) for t in event.token_ids]


def set_copies(linears: list[Int4Linear], copies: list) -> None:
    for linear, copy in zip(linears, copies):
        linear.dense = copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    claim_fresh_folder(args.out)
    models = load_models(EngineOptions(), progress=False)
    linears = [m for m in models.target.model.modules() if isinstance(m, Int4Linear)]
    kept = [linear.dense for linear in linears]
    variants = {"with copies": kept, "without copies": [None] * len(linears)}
    check = ExactnessCheck(models.target, models.stop_ids, args.max_new_tokens, near_tie=BF16_NEAR_TIE,
                           max_ties=UNBOUNDED)
    rows = []
    for index, prompt in enumerate(mtbench_first_turns(args.prompts)):
        prompt_ids = encode_prompt(models.tokenizer, prompt, raw=False)
        for name, sampling in SAMPLINGS.items():
            set_copies(linears, [None] * len(linears))  # the reference: one-token passes, fused kernel
            reference = tokens(models.engine("autoregressive"), prompt_ids, args.max_new_tokens, sampling)
            for variant, copies in variants.items():
                set_copies(linears, copies)
                engine_tokens = tokens(models.engine("specexec"), prompt_ids, args.max_new_tokens, sampling)
                comparison = check.compare(prompt_ids, reference, engine_tokens, sampling)
                row = {"prompt_index": index, "sampling": name, "variant": variant, "ties": len(comparison.ties),
                       "gaps": [tie.gap for tie in comparison.ties], "other_difference": comparison.mismatch is not None,
                       "copies": sum(copy is not None for copy in copies)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    set_copies(linears, kept)
    (args.out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines = [table_header(code_version()), "", "| sampling | variant | replies | most ties in a reply | ties in all | largest gap | "
             "other differences |", "|---|---|---|---|---|---|---|"]
    for name in SAMPLINGS:
        for variant in variants:
            group = [row for row in rows if row["sampling"] == name and row["variant"] == variant]
            lines.append(f"| {name} | {variant} | {tie_cells(group)} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    models.close()


def tie_cells(group: list[dict]) -> str:
    """A group of judged replies' table cells: replies, most ties in one, ties in all, the largest
    gap, other differences."""
    gaps = [gap for row in group for gap in row["gaps"]]
    return (f"{len(group)} | {max(row['ties'] for row in group)} | {len(gaps)} | {max(gaps, default=0):.3g} | "
            f"{sum(row['other_difference'] for row in group)}")


if __name__ == "__main__":
    main()
