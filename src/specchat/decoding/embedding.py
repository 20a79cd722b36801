"""A text's embedding from the target: its final-norm hidden states (the rows the LM head reads,
llama.cpp's `t_embd`) pooled into one vector, as llama-server's `--pooling` pools a model's.

A generative model declares no pooling of its own (llama.cpp then pools nothing and its
/v1/embeddings refuses until `--pooling` names one). `mean` averages every position's row: under
causal attention the early rows saw only the text's start, but untrained decoder models retrieve
better so than by their last row (LLM2Vec's baselines); `last` takes the last row, the only one
that saw the whole text, which decoder models trained as embedders (Qwen3-Embedding, E5-Mistral)
read. The pass runs on a cache of its own: the engine's kept caches are left as they were.
"""

import torch

from specchat.decoding.forward import CausalLM
from specchat.limits import POOLINGS


def pooled(rows: torch.Tensor, pooling: str) -> torch.Tensor:
    """Hidden rows [n, H] -> one float32 vector [H]: their mean, or the last row."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)} (got {pooling!r})")
    rows = rows.float()
    return rows.mean(dim=0) if pooling == "mean" else rows[-1]


def embedding(target: CausalLM, token_ids: list[int], pooling: str) -> torch.Tensor:
    """The embedding of `token_ids` (at least one) on the CPU: the whole text in one pass from
    position 0, as a prompt's prefill runs."""
    if not token_ids:
        raise ValueError("an embedding needs at least one token")
    return pooled(target.rows_from_start(token_ids), pooling).cpu()
