"""What "exact" means in bfloat16: how often specexec's tokens equal sequential decoding's.

In float32 the tests prove specexec emits the target's own tokens (near-ties aside). In bf16 a
tree pass over many tokens and a one-token sequential pass round differently (bf16 keeps 8
significant bits: logits near 16 are spaced 0.125 apart), so where two tokens nearly tie the
two paths may pick different ones, and the rest of the reply follows from that pick. This script
measures it, on the shipped defaults (bf16, `--budget auto`, the approximated draft):

- greedy: specexec against specchat autoregressive, both bf16;
- seeded t/top-p: specexec against seeded autoregressive, both bf16;
- for scale, bf16 autoregressive against float32 autoregressive of the dense target (greedy), the
  divergence every user of a bf16 model already has. The bf16 target is the app's: since the
  packed target became the default (2026-11-25), the stored 4-bit weights, so this row is also the
  packed target's agreement with the float32 dequantized model.

For each prompt it records the first index where the two token lists differ and the gap there:
how far the first list's token sits below the one the reference picks, in logits of the
reference's own sequential forward (greedy: max logit minus the token's logit; sampled: the
logit spread that would move the seeded draw onto it, as tests/helpers/exactness.py defines).

Usage: python scripts/bench_bf16_agreement.py --out DIR [--prompts 20] [--max-new-tokens 64]
           [--temperature 0.6] [--top-p 0.9] [--seed 1234]
DIR must be new or empty: it receives results.jsonl (one row per prompt and comparison) and
table.md. Figures are pooled: "tokens before the first difference" sums over prompts and
divides by all tokens the reference emitted.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the gap's definition lives with the checker
from helpers.exactness import Sequential, first_difference, token_gap  # noqa: E402

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.provenance import claim_fresh_folder, code_version, table_header
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import Engine, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.models.loading import load
from specchat.loader import load_models
from specchat.engine_options import EngineOptions
from specchat.runtime import encode_prompt

COMPARISONS = ("greedy specexec vs autoregressive", "seeded specexec vs autoregressive",
               "greedy bf16 vs float32 autoregressive")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args()


def tokens_of(engine: Engine, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> list[int]:
    return [t for event in engine.generate(prompt_ids, max_new_tokens, sampling) for t in event.token_ids]


def compare(reference_lm: CausalLM, prompt_ids: list[int], reference: list[int], tokens: list[int],
            sampling: SamplingParams) -> dict:
    """The first difference of `tokens` from `reference` and the gap there, in the reference's
    logits (None when the lists are equal or one merely ends first)."""
    index = first_difference(reference, tokens, 0)
    gap = None
    if index is not None and index < min(len(reference), len(tokens)):
        sequential = Sequential(reference_lm)
        sequential.feed(prompt_ids + tokens[:index])
        gap = token_gap(sequential.logits.float(), tokens[index], sampling, sequential.position)
    agreed = len(reference) if index is None else index
    return {"reference_tokens": len(reference), "tokens": len(tokens), "first_difference": index,
            "agreed_tokens": agreed, "gap": gap}


def table(rows: list[dict]) -> str:
    lines = ["| comparison | prompts identical | tokens before the first difference | gaps at the first difference "
             "(logits) |", "|---|---|---|---|"]
    for name in COMPARISONS:
        at = [row for row in rows if row["comparison"] == name]
        identical = sum(row["first_difference"] is None for row in at)
        agreed = sum(row["agreed_tokens"] for row in at) / sum(row["reference_tokens"] for row in at)
        gaps = sorted(row["gap"] for row in at if row["gap"] is not None)
        shown = ", ".join(f"{gap:.3f}" for gap in gaps) or "-"
        lines.append(f"| {name} | {identical}/{len(at)} | {agreed:.1%} | {shown} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    claim_fresh_folder(args.out)
    models = load_models(EngineOptions(offload="none"), engines=("autoregressive",))
    float32 = CausalLM(load(models.identity["target"], torch.float32, progress=False).model)
    greedy = SamplingParams(0.0, 1.0, args.seed)
    seeded = SamplingParams(args.temperature, args.top_p, args.seed)
    version, rows = code_version(), []
    prompts = [encode_prompt(models.tokenizer, text, raw=False) for text in mtbench_first_turns(args.prompts)]
    for index, prompt_ids in enumerate(prompts):
        autoregressive, specexec = models.engine("autoregressive"), models.engine("specexec")
        n = args.max_new_tokens
        reference = tokens_of(autoregressive, prompt_ids, n, greedy)
        found = {
            COMPARISONS[0]: compare(models.target, prompt_ids, reference, tokens_of(specexec, prompt_ids, n, greedy),
                                    greedy),
            COMPARISONS[1]: compare(models.target, prompt_ids, tokens_of(autoregressive, prompt_ids, n, seeded),
                                    tokens_of(specexec, prompt_ids, n, seeded), seeded),
            COMPARISONS[2]: compare(float32, prompt_ids,
                                    tokens_of(AutoregressiveEngine(float32, models.stop_ids), prompt_ids, n, greedy),
                                    reference, greedy),
        }
        for name, figures in found.items():
            row = {"comparison": name, "prompt_index": index, "max_new_tokens": n, "code": version, **figures}
            rows.append(row)
            with (args.out / "results.jsonl").open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"prompt {index} {name}: first difference {figures['first_difference']}", file=sys.stderr, flush=True)
    text = table(rows)
    (args.out / "table.md").write_text(f"{table_header(version)}\n\n{text}\n", encoding="utf-8")
    print(text)
    models.close()


if __name__ == "__main__":
    main()
