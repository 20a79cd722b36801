"""Passes over random token trees after a cached prefix, as a SpecExec target scores a tree: a
random valid tree (each node's parent an earlier node), its mask and positions, and a pass over it
with the cache cut back to the prefix first, so that every pass sees the same cache."""

from dataclasses import dataclass

import torch
from gpu_checks.passes import tree_depths, tree_mask
from torch import Tensor

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import SlotCache, new_cache, truncate


@dataclass(frozen=True)
class Tree:
    tokens: Tensor  # [n]
    positions: Tensor  # [n]: the prefix's length plus each node's depth
    mask: Tensor  # bool [n, cached + n]


def random_parents(n: int, generator: torch.Generator) -> list[int]:
    """A root, then each node's parent drawn uniformly from the nodes before it."""
    later = torch.arange(1, n)
    picks = (torch.rand(n - 1, generator=generator) * later).long().clamp(max=later - 1)
    return [-1, *picks.tolist()]


def random_tree(n: int, cached: int, vocab: int, seed: int = 0) -> Tree:
    generator = torch.Generator().manual_seed(seed)
    parents = random_parents(n, generator)
    tokens = torch.randint(0, vocab, (n,), generator=generator)
    return Tree(tokens, cached + torch.tensor(tree_depths(parents)), tree_mask(cached, parents))


def prefilled(lm: CausalLM, cached: int) -> SlotCache:
    """A cache holding `cached` tokens, written by one pass."""
    cache = new_cache()
    vocab = lm.model.config.vocab_size
    lm.hidden(torch.arange(cached) % vocab, torch.arange(cached), cache)
    return cache


def tree_pass(lm: CausalLM, cache: SlotCache, cached: int, tree: Tree) -> Tensor:
    """The hidden states of a pass over `tree` after the first `cached` tokens of `cache`."""
    truncate(cache, cached)
    return lm.hidden(tree.tokens, tree.positions, cache, tree.mask)
