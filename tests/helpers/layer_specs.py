"""A small MoE layer's tensors as a layout takes them (name, dtype, shape): a head (attention,
norm) and two experts' units, listed out of order, with each tensor's values apart from the others'."""

import torch

F32 = torch.float32
SPECS = [("attn.q", F32, (5, 3)), ("experts.0.w", F32, (7,)), ("norm", F32, (3,)), ("experts.1.w", F32, (100,)),
         ("experts.1.b", F32, (2,)), ("experts.0.b", F32, (1,))]
UNIT_OF = {"experts.0.w": 0, "experts.0.b": 0, "experts.1.w": 1, "experts.1.b": 1}


def tensors() -> dict[str, torch.Tensor]:
    """SPECS' tensors, tensor i holding 1000 i, 1000 i + 1, ..."""
    return {name: torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape) + 1000 * i
            for i, (name, dtype, shape) in enumerate(SPECS)}
