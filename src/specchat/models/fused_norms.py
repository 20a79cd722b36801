"""A draft's RMS norms as one kernel each: torch's rms_norm, which CUDA runs fused.

transformers' Llama-family RMSNorm is eight kernels on a GPU (the cast to float32, the square,
the mean, the epsilon, the reciprocal root, the product, the cast back, the weight): two norms a
decoder layer, 16 of a captured draft step's ~40 kernels a layer, each a few microseconds on an
H200 however few its rows. torch.nn.functional.rms_norm computes the same norm in one
(`_fused_rms_norm` on CUDA), rounding once where transformers rounds twice (the normalized
states to the input's dtype, then their product with the weight). Only drafts use it: SpecExec's
verifier never reads a draft's probabilities, and a target's norms stay those its exactness is
checked with.
"""

import torch
from torch import nn

# transformers' norms whose forward is LlamaRMSNorm's (tests/models/test_fused_norms.py reads their
# sources); Gemma's scales by 1 + weight and is not among them
LLAMA_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "MixtralRMSNorm",
                         "Qwen2MoeRMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm"})


class FusedRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, in one rms_norm call."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.variance_epsilon

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(hidden, self.weight.shape, self.weight, self.eps)


def fuse_norms(module: nn.Module) -> int:
    """Replace every LLAMA_NORMS norm inside `module` by a FusedRMSNorm of its weight; how many."""
    found = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if type(child).__name__ in LLAMA_NORMS]
    for parent, name, child in found:
        setattr(parent, name, FusedRMSNorm(child))
    return len(found)
