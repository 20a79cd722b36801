"""The alias pairs `gpu_check.sh --pair` runs, by name only: what its options name before anything
heavy loads (the checkpoints themselves are pair_models.py's)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class PairAliases:
    target: str
    draft: str


# The paper's pair (Llama-2-70B-GPTQ beside Llama-2-7B) and UMbreLLa's (Llama-3.1-70B-AWQ beside 8B-AWQ).
PAIRS = (PairAliases("llama-2-70b-gptq", "llama-2-7b"), PairAliases("llama-3.1-70b-awq", "llama-3.1-8b-awq"))
