"""The --pair check's verdicts (issue 48's bounds on a GPU): a draft step of a 7B-shaped draft within
10 ms up to 256-token steps (its forward and top children), host work within 5% of an iteration
(the tree's bookkeeping between the draft's steps included), the whole iteration at budget
1024 within 1.3x the pass's streaming time, and Llama-3.1-70B-AWQ with its 8B-AWQ draft projected
at 10 tokens/s or more on a 24 GB PCIe 4.0 card. A dry run gives none."""

from gpu_checks.pair_rows import CARD_LINK_GBPS, BudgetRow, projected_s
from gpu_checks.verdict import Verdict, judged, skipped

from specchat.decoding.tree import TreeShape
from specchat.doctor.plan import PAPER_GEN_RATES

STEP_MS = 10.0
STEP_TOKENS = 256  # the bound is for steps of 1-256 new tokens: budgets whose steps expand at most that many
HOST_SHARE = 0.05
JUDGED_BUDGET = 1024
ITERATION_OVER_STREAMING = 1.3
CARD_TOKENS_PER_S = 10.0
PROJECTED_PAIR = "llama-3.1-70b-awq"


def pair_verdicts(target: str, rows: list[BudgetRow], card_pass_bytes: float, dry_run: bool) -> list[Verdict]:
    names = [f"{target}: draft step", f"{target}: host work", f"{target}: iteration at {JUDGED_BUDGET}"]
    if target == PROJECTED_PAIR:
        names.append(f"{target}: 24 GB PCIe 4 projection")
    if dry_run:
        return [skipped(name, "dry run: no verdict (shrunk models on the CPU)") for name in names]
    judged_row = next((r for r in rows if r.budget == JUDGED_BUDGET), None)
    if judged_row is None:
        return [skipped(name, f"budget {JUDGED_BUDGET} was not run") for name in names]
    verdicts = [step_verdict(names[0], rows), host_verdict(names[1], rows), iteration_verdict(names[2], judged_row)]
    if target == PROJECTED_PAIR:
        verdicts.append(card_verdict(names[3], judged_row, card_pass_bytes))
    return verdicts


def step_verdict(name: str, rows: list[BudgetRow]) -> Verdict:
    slowest = max((r for r in rows if TreeShape(r.budget).expansion_batch <= STEP_TOKENS), key=lambda r: r.step_ms)
    return judged(name, slowest.step_ms <= STEP_MS, f"{slowest.step_ms:.1f} ms a step at most (budget "
                  f"{slowest.budget}), bound {STEP_MS:g} ms")


def host_verdict(name: str, rows: list[BudgetRow]) -> Verdict:
    worst = max(rows, key=lambda r: r.host_share)
    return judged(name, worst.host_share <= HOST_SHARE, f"{worst.host_share:.1%} of an iteration at most (budget "
                  f"{worst.budget}), bound {HOST_SHARE:.0%}")


def iteration_verdict(name: str, row: BudgetRow) -> Verdict:
    """Judged against the pass's streaming, as the issue bounds it; every layer's streaming beside
    it, for the owner's question whether resident layers should shrink the denominator."""
    ratio = row.iteration_s / row.stream_s if row.stream_s else float("inf")
    layers = row.plan["resident_layers"] + row.plan["ram_layers"] + row.plan["disk_layers"]
    every = (f"; {row.iteration_s / row.all_layers_stream_s:.2f}x all {layers} layers' "
             f"{row.all_layers_stream_s:.3f} s" if row.all_layers_stream_s else "")
    return judged(name, ratio <= ITERATION_OVER_STREAMING, f"{row.iteration_s:.3f} s, {ratio:.2f}x the pass's "
                  f"{row.stream_s:.3f} s of streaming, bound {ITERATION_OVER_STREAMING:g}x{every}")


def card_verdict(name: str, row: BudgetRow, card_pass_bytes: float) -> Verdict:
    seconds = projected_s(row, card_pass_bytes, CARD_LINK_GBPS)
    low, high = (rate / seconds for rate in PAPER_GEN_RATES.rates)
    return judged(name, high >= CARD_TOKENS_PER_S,
                  f"{low:.1f}-{high:.1f} tokens/s projected ({seconds:.3f} s an iteration, "
                  f"{PAPER_GEN_RATES.rates[0]:g}-{PAPER_GEN_RATES.rates[1]:g} tokens a pass, {CARD_LINK_GBPS:g} GB/s "
                  f"assumed), bound {CARD_TOKENS_PER_S:g} at the upper rate")
