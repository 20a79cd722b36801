"""Every bf16 divergence of the shipped defaults' replies, with its gap: the measurement behind
tests/real/test_real_defaults.py's and test_real_compact.py's seeded bounds (issue 38).

The defaults (bf16, the packed int4 target with the dense copies the plan keeps, the draft as
`--draft-quant auto` resolves it) run specexec as the tests do: `--budget auto` over this machine's
probed costs, the grown trees (auto over the project machine's costs, the int8 sub-vocabulary
draft), and a fixed budget of 64 (a third tree shape, as other probed costs would give). Each reply
is compared with bf16 autoregressive decoding of the same target (tests/helpers/exactness.py's check) and
with the independent loop on the same target object's transformers forward
(tests/helpers/reference_loop.py); both re-anchor at every difference and go on, with no bound, so every
divergence is recorded with its gap (logits: greedy, the argmax's lead; seeded, T log(1 + r), r the
draw's distance from the token's slot of the cumulative distribution). `--target compact` runs
test_real_compact.py's target instead (every layer streamed, Q6_K head, budget 16; the AR
reference only: its streamed layers have no plain transformers forward).

Usage: python scripts/bench_bf16_gaps.py --out DIR [--target defaults|compact] [--prompts 8]
       [--max-new-tokens 32] [--seeds 0 1 2]
DIR must be new or empty: it receives results.jsonl (one row per prompt, sampling, engine and
reference) and table.md.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checkers live with the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "real"))  # the real pair's test modules
from helpers.exactness import ExactnessCheck  # noqa: E402
from helpers.reference_loop import reference_decode, ties_against_reference  # noqa: E402
from test_real_compact import RAM_BUDGET_GB  # noqa: E402
from test_real_defaults import grown_engine as grown_specexec  # noqa: E402

from bench_bf16_ties import tie_cells  # noqa: E402  (scripts/ is the running script's folder)

from specchat.bench.datasets import mtbench_first_turns
from specchat.bench.provenance import claim_fresh_folder, code_version, table_header
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.limits import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from specchat.loader import load_models
from specchat.models.draft import DraftQuant, load_draft
from specchat.progress import Reporter
from specchat.quant.int8 import Int8Linear
from specchat.engine_options import EngineOptions
from specchat.runtime import encode_prompt

UNBOUNDED = float("inf")  # record every divergence: the bound is what this measures


def tokens(engine, prompt_ids: list[int], count: int, sampling: SamplingParams) -> tuple[list[int], int]:
    events = list(engine.generate(prompt_ids, count, sampling))
    return [t for e in events for t in e.token_ids], max((e.tree_size for e in events[1:]), default=0)


def grown_engine(models):
    """test_real_defaults' grown trees: auto over the project machine's costs, the int8 draft."""
    draft = models.draft
    if not any(isinstance(m, Int8Linear) for m in draft.model.modules()):
        options = EngineOptions()
        draft = load_draft(options.draft, models.device, models.target.dtype, None, models.tokenizer,
                           Reporter(False), DraftQuant("int8"), options.draft_vocab)
    return grown_specexec(models, draft)


def loop_gaps(models, prompt_ids, reply, count, sampling, reference) -> tuple[list[float], bool]:
    """The reply against the independent loop on the same target object: every divergence's gap,
    and whether it ended on a difference that is no tie (the two replies of different lengths)."""
    try:
        ties = ties_against_reference(models.target.model, prompt_ids, reply, count, sampling.temperature,
                                      sampling.top_p, sampling.seed, models.stop_ids, UNBOUNDED, reference)
    except AssertionError:
        return [], True
    return [gap for _, gap in ties], False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", choices=("defaults", "compact"), default="defaults")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    claim_fresh_folder(args.out)
    count = args.max_new_tokens
    if args.target == "defaults":
        models = load_models(EngineOptions(), progress=False)
        engines = {"auto": models.engine("specexec"), "grown": grown_engine(models),
                   "budget 64": models.engine("specexec", LiveSettings(budget=64))}
    else:
        options = EngineOptions(offload="disk", resident_layers=0, ram_budget=RAM_BUDGET_GB, budget=16,
                                offload_dir=str(args.out / "layers"))
        models = load_models(options, progress=False)
        engines = {"budget 16": models.engine("specexec", LiveSettings(budget=16))}
    check = ExactnessCheck(models.target, models.stop_ids, count, near_tie=UNBOUNDED, max_ties=10**6)
    samplings = [SamplingParams(0.0)] + [SamplingParams(DEFAULT_TEMPERATURE, DEFAULT_TOP_P, s) for s in args.seeds]
    rows = []
    for index, prompt in enumerate(mtbench_first_turns(args.prompts)):
        prompt_ids = encode_prompt(models.tokenizer, prompt, raw=False)
        for sampling in samplings:
            name = "greedy" if sampling.temperature == 0 else f"seed {sampling.seed}"
            reference, _ = tokens(models.engine("autoregressive"), prompt_ids, count, sampling)
            replies = {"autoregressive": (reference, 0)}
            loop = reference_decode(models.target.model, prompt_ids, count, sampling.temperature, sampling.top_p,
                                    sampling.seed, models.stop_ids, use_cache=True) if args.target == "defaults" else None
            replies.update({variant: tokens(engine, prompt_ids, count, sampling) for variant, engine in engines.items()})
            for variant, (reply, largest_tree) in replies.items():
                comparison = check.compare(prompt_ids, reference, reply, sampling)
                judged = {"ar": ([t.gap for t in comparison.ties], comparison.mismatch is not None)}
                if args.target == "defaults":
                    judged["loop"] = loop_gaps(models, prompt_ids, reply, count, sampling, loop)
                for against, (gaps, other) in judged.items():
                    row = {"prompt_index": index, "sampling": name, "engine": variant, "reference": against,
                           "tokens": len(reply), "largest_tree": largest_tree, "ties": len(gaps), "gaps": gaps,
                           "other_difference": other}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    (args.out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines = [table_header(code_version()), "", f"{args.target}, {args.prompts} prompts x {count} tokens", "",
             "| sampling | engine | reference | replies | most ties in a reply | ties in all | largest gap | "
             "other differences |", "|---|---|---|---|---|---|---|---|"]
    for key in sorted({(r["sampling"] == "greedy", r["engine"], r["reference"]) for r in rows}, reverse=True):
        group = [r for r in rows if (r["sampling"] == "greedy", r["engine"], r["reference"]) == key]
        lines.append(f"| {'greedy' if key[0] else 'seeded'} | {key[1]} | {key[2]} | {tie_cells(group)} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    models.close()
    shutil.rmtree(args.out / "layers", ignore_errors=True)  # compact's layer file: GBs, not results


if __name__ == "__main__":
    main()
