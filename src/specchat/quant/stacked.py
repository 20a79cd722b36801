"""Linears that multiply the same input, run as one product: a layer's q/k/v projections and its
MLP's gate/up projections (Llama, Qwen2 and their kin name them alike).

transformers calls them one after another on the same hidden states. One product over their
stacked weights reads the input once and makes one kernel call instead of three (or two); for the
int8 draft that also quantizes the input once. Over the 1.5B's 28 layers (int8, dynamic kernel,
scripts/bench_stacked_projections.py) that is a small gain at 1 and 16 rows and none beyond the
noise at 4 and 64 (docs/benchmarks.md).

Each projection becomes a `Part` of a shared `Stack`. The stack keeps its last input and output
until every part has taken its columns, then lets them go; a part called with an input the stack
has not seen (or a second time) runs the product again, so any calling order stays correct.
"""

import torch
from torch import nn

from specchat.quant.int8 import dense_linear

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Stack(nn.Module):
    """One linear over the stacked weights of several, and which parts still want its output."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biased = any(linear.bias is not None for linear in linears)
        self.linear = dense_linear(weight, torch.cat([bias_of(linear) for linear in linears]) if biased else None)
        ends = torch.tensor([linear.out_features for linear in linears]).cumsum(0).tolist()
        self.bounds = list(zip([0, *ends[:-1]], ends))
        self.input: torch.Tensor | None = None
        self.output: torch.Tensor | None = None
        self.waiting: set[int] = set()

    def columns(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Part `index`'s output for input `x`."""
        if x is not self.input or index not in self.waiting:
            self.input, self.output, self.waiting = x, self.linear(x), set(range(len(self.bounds)))
        start, end = self.bounds[index]
        out = self.output[..., start:end]
        self.waiting.discard(index)
        if not self.waiting:
            self.input = self.output = None
        return out


class Part(nn.Module):
    """Stands where one of the stacked linears stood."""

    def __init__(self, stack: Stack, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "stack", stack)  # registered once, on the layer that holds the parts
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack.columns(self.index, x)


def bias_of(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    return torch.zeros(linear.out_features, device=linear.weight.device, dtype=linear.weight.dtype)


def stack_projections(module: nn.Module) -> int:
    """Inside `module`, replace every group of GROUPS whose members are plain nn.Linears of one
    input width by Parts of one Stack; returns how many stacks were made."""
    made = 0
    for child in list(module.modules()):  # the loop adds modules
        for group in GROUPS:
            linears = [getattr(child, name, None) for name in group]
            if all(type(linear) is nn.Linear for linear in linears) and len({linear.in_features for linear in linears}) == 1:
                stack = Stack(linears)
                child.add_module("_".join(name.removesuffix("_proj") for name in group) + "_stack", stack)
                for index, name in enumerate(group):
                    setattr(child, name, Part(stack, index))
                made += 1
    return made
