"""A draft that mostly agrees with its target: the target's own float weights, each perturbed in
place by noise of a fifth of its parameter's spread (seeded), so that some drafted tokens are
accepted and some are not."""

import torch
from transformers import PreTrainedModel


def perturbed(model: PreTrainedModel) -> PreTrainedModel:
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator) * parameter.std())
    return model
