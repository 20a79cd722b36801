"""A Q6Linear over random Q6_K blocks, for the tests of the Q6_K product and of its widening, and a
Q6Weight read back from a checkpoint by its tensors' names."""

from collections.abc import Callable

import torch
from gguf import GGMLQuantizationType, quants
from helpers.gguf_files import random_blocks

from specchat.quant.q6k import Q6_SUFFIXES, Q6Weight, q6k_to_weight
from specchat.quant.q6k_linear import Q6Linear


def q6_linear(out_features: int, in_features: int, seed: int = 0) -> tuple[Q6Linear, torch.Tensor]:
    """A Q6Linear over random Q6_K blocks, and gguf's float32 dequantization of them."""
    data = random_blocks(GGMLQuantizationType.Q6_K, out_features, in_features, seed=seed)
    weight = q6k_to_weight(data)
    linear = Q6Linear(in_features, out_features)
    linear.q6_values, linear.q6_scales, linear.q6_d = weight.values, weight.scales, weight.d
    return linear, torch.from_numpy(quants.dequantize(data, GGMLQuantizationType.Q6_K))


def read_q6(read: Callable[[str], torch.Tensor], module: str) -> Q6Weight:
    """The Q6Weight stored under `module`, its tensors got by name through `read`."""
    return Q6Weight(*(read(module + suffix) for suffix in Q6_SUFFIXES))
