"""The passes the logits checks run on a model and its streamed copy: a prompt, a tree-masked
pass over a small tree after it (as a SpecExec target pass scores a tree), then single tokens
after the prompt; the logits of every pass, on the host."""

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache, truncate

PROMPT = list(range(3, 15))
TREE_TOKENS = [20, 21, 22, 23, 24]
TREE_PARENTS = [-1, 0, 0, 1, 2]  # a root, two children, a grandchild under each
STEPS = [30, 31]
COUNT = 2 + len(STEPS)  # passes over every layer


def tree_mask(cached: int, parents: list[int]) -> torch.Tensor:
    """bool [n, cached + n]: a node sees the cached prefix, its ancestors and itself."""
    mask = torch.zeros(len(parents), cached + len(parents), dtype=torch.bool)
    mask[:, :cached] = True
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node] = mask[parent]
        mask[node, cached + node] = True
    return mask


def tree_depths(parents: list[int]) -> list[int]:
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def pass_logits(lm: CausalLM) -> list[torch.Tensor]:
    cache, logits = new_cache(), []

    def run(tokens: list[int], positions: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        logits.append(lm.logits(lm.hidden(torch.tensor(tokens), positions, cache, mask)).cpu())

    cached = len(PROMPT)
    run(PROMPT, torch.arange(cached))
    run(TREE_TOKENS, cached + torch.tensor(tree_depths(TREE_PARENTS)), tree_mask(cached, TREE_PARENTS))
    truncate(cache, cached)  # the tree is dropped, as a walk that accepts nothing drops it
    for step, token in enumerate(STEPS):
        run([token], torch.tensor([cached + step]))
    return logits


def max_difference(got: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True))
