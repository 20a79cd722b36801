"""What attention tests draw: queries, keys and values of a grouped-query attention and a tree-like
mask, and the little of a module that transformers' attention interface reads."""

import torch


class Attention:
    """What the attention interface reads of its module."""

    def __init__(self, groups: int) -> None:
        self.num_key_value_groups, self.is_causal, self.training = groups, True, False


def drawn(groups: int, rows: int = 5, keys: int = 12, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q [1, 2 groups, rows, 16] over k, v [1, 2, keys, 16] (two KV heads), and a random boolean
    mask [1, 1, rows, keys] in which every row sees its first key."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, 2 * groups, rows, 16, generator=generator)
    key, value = (torch.randn(1, 2, keys, 16, generator=generator) for _ in range(2))
    attend = torch.rand(1, 1, rows, keys, generator=generator) > 0.4
    attend[..., 0] = True  # every row sees something
    return query, key, value, attend
