"""Linears that multiply the same input, run as one product: a layer's q/k/v projections and its
MLP's gate/up projections (Llama, Qwen2 and their kin name them alike).

transformers calls them one after another on the same hidden states. One product over their
stacked weights reads the input once and makes one kernel call instead of three (or two); for the
int8 draft that also quantizes the input once. Over the 1.5B's 28 layers (int8, dynamic kernel,
scripts/bench_stacked_projections.py) that is a small gain at 1 and 16 rows and none beyond the
noise at 4 and 64 (docs/benchmarks.md). On CUDA a draft's step is launch-bound and its products
narrow: a 7B's k and v (1024 outputs in Llama 3) fill few of an H200's 132 processors, where the
three stacked fill 6x as many; 4-bit linears (Int4Linear) stack too, their packed rows and
scales laid end to end (the kernel layouts tile whole rows: CUDA's 8, a CPU's its layout's).

Each projection becomes a `Part` of a shared `Stack`. The stack keeps its last input and output
until every part has taken its columns, then lets them go; a part called with an input the stack
has not seen (or a second time) runs the product again, so any calling order stays correct.
"""

import torch
from torch import nn

from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_layout import layout_for
from specchat.quant.int8 import dense_linear

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Stack(nn.Module):
    """One linear over the stacked weights of several, and which parts still want its output."""

    def __init__(self, linears: list[nn.Module]) -> None:
        super().__init__()
        self.linear = stacked_int4(linears) if isinstance(linears[0], Int4Linear) else stacked_dense(linears)
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


def stacked_dense(linears: list[nn.Linear]) -> nn.Linear:
    weight = torch.cat([linear.weight.detach() for linear in linears])
    biased = any(linear.bias is not None for linear in linears)
    return dense_linear(weight, torch.cat([bias_of(linear) for linear in linears]) if biased else None)


def stacked_int4(linears: list[Int4Linear]) -> Int4Linear:
    """One Int4Linear whose outputs are `linears`' in turn (int4_stackable's)."""
    first = linears[0]
    biased = any(linear.bias is not None for linear in linears)
    with torch.device("meta"):  # its buffers are the parts' laid end to end, below
        stacked = Int4Linear(first.in_features, sum(linear.out_features for linear in linears), first.group_size,
                             biased, first.perm is not None, first.compute_dtype, torch.device(first.kernel))
    stacked.packed = torch.cat([linear.packed for linear in linears])
    stacked.scales_and_zeros = torch.cat([linear.scales_and_zeros for linear in linears], dim=1)
    stacked.perm = first.perm
    stacked.bias = torch.cat([bias_of(linear) for linear in linears]) if biased else None
    stacked.registers = first.registers
    return stacked


def bias_of(linear: nn.Linear | Int4Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    like = linear.scales_and_zeros if isinstance(linear, Int4Linear) else linear.weight
    return torch.zeros(linear.out_features, device=like.device, dtype=like.dtype)


def stackable(linears: list[nn.Module | None], packed: bool) -> bool:
    """Plain nn.Linears, or (`packed`) Int4Linears that int4_stackable, all of one input width."""
    if len({getattr(linear, "in_features", None) for linear in linears}) != 1:
        return False
    if all(type(linear) is nn.Linear for linear in linears):
        return True
    return packed and all(type(linear) is Int4Linear for linear in linears) and int4_stackable(linears)


def int4_stackable(linears: list[Int4Linear]) -> bool:
    """Whether their buffers laid end to end are one Int4Linear's: one packing (device, groups,
    dtype, input order), none pinned to a kernel or holding a dense copy, and a layout of whole
    tiles of rows (CUDA's; a CPU's where int4_layout reads it)."""
    first = linears[0]
    if any((linear.group_size, linear.kernel, linear.compute_dtype) != (first.group_size, first.kernel,
                                                                        first.compute_dtype)
           or linear.widths is not None or linear.dense is not None for linear in linears):
        return False
    if any((linear.perm is None) != (first.perm is None) or (linear.perm is not None and not torch.equal(
            linear.perm, first.perm)) for linear in linears):
        return False
    # int4_fits gives every part whole tiles (CUDA's 8 rows; a CPU layout's rows, where it reads one)
    return first.kernel == "cuda" or layout_for(torch.device(first.kernel), first.in_features) is not None


def stack_projections(module: nn.Module, packed: bool = False) -> int:
    """Inside `module`, replace every group of GROUPS whose members are plain nn.Linears (with
    `packed`, or Int4Linears of one packing) of one input width by Parts of one Stack; returns how
    many stacks were made."""
    made = 0
    for child in list(module.modules()):  # the loop adds modules
        for group in GROUPS:
            linears = [getattr(child, name, None) for name in group]
            if stackable(linears, packed):
                stack = Stack(linears)
                child.add_module("_".join(name.removesuffix("_proj") for name in group) + "_stack", stack)
                for index, name in enumerate(group):
                    setattr(child, name, Part(stack, index))
                made += 1
    return made
