"""A Linear whose 4-bit weight stays packed: torch's fused int4 kernel for narrow inputs, chunked
dequantization, CUDA's expansion or a CPU's dense copy for wide ones (which one at which width on
which device: quant/widths.py).

The weight is an Int4Weight (int4_weight: w = (q - 8) * scale + zero per group of inputs) held as
its device's kernel reads it, in buffers, so that it travels with state_dict and streams through
the offload ring like any layer tensor:
  packed            the kernel layout (int4_pack): uint8 [O, I/2] on a CPU, int32 [O/8, I/16t, 32, t/2] on CUDA
  scales_and_zeros  [G, O, 2] in the compute dtype (the kernels take them in the input's dtype)
  perm              long [I], act-order only: input i of the weight is input perm[i] of the layer
  bias              [O] in the compute dtype, when the layer has one
The layout is made once, when the weight is packed for its device (`int4_tensors`), and stored as
such (a layer file holds it; nothing is repacked per pass). In float32 the scales and zeros are the
weight's own and the fused CPU kernel's weights are bitwise the Int4Weight's; in bf16 they are
rounded to bf16 once, at packing (each weight moves by at most 2**-8 (|q - 8| |scale| + |zero|)).
"""

import torch
from torch import Tensor, nn

from specchat.errors import SpecchatError
from specchat.quant.int4_chunks import chunked_workspace
from specchat.quant.int4_expand import expanded_workspace
from specchat.quant.int4_layout import layout_for
from specchat.quant.int4_pack import FUSED_DTYPES, GROUP_SIZES, ROW_MULTIPLE, check_shape, pack, packed_shape
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.widths import UNLIMITED, WidthChoice, int4_product


class Int4Linear(nn.Module):
    """y = x w^T + b with w packed for `kernel`'s device type; its buffers are made empty (on the
    default device: meta inside a skeleton) and filled by `int4_tensors`' values."""

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool, act_order: bool,
                 dtype: torch.dtype, kernel: torch.device) -> None:
        super().__init__()
        check_shape(out_features, in_features, group_size)
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.kernel, self.compute_dtype = kernel.type, dtype
        self.widths: WidthChoice | None = None  # None: the measured choice (widths.py; `use_fused_only`)
        self.dense = None  # int4_dense.DenseCopy: wide inputs multiply it (a plain attribute: no state_dict entry)
        self.registers = False  # a draft's (`use_registers`): on CUDA int4_gemm may serve its steps (widths.py)
        shape, packed_dtype = packed_shape(out_features, in_features, kernel.type)
        self.register_buffer("packed", torch.empty(shape, dtype=packed_dtype))
        self.register_buffer("scales_and_zeros", torch.empty(in_features // group_size, out_features, 2, dtype=dtype))
        self.register_buffer("perm", torch.empty(in_features, dtype=torch.long) if act_order else None)
        self.register_buffer("bias", torch.empty(out_features, dtype=dtype) if bias else None)

    def group_scales(self) -> Tensor:
        """scales_and_zeros [G, O, 2] in the compute dtype, as the kernels take them."""
        return self.scales_and_zeros

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != self.compute_dtype or x.device.type != self.kernel:
            raise SpecchatError(f"an Int4Linear packed for {self.kernel} in {self.compute_dtype} was given "
                                f"{x.dtype} inputs on {x.device.type}")
        flat = x.reshape(-1, self.in_features)
        if self.perm is not None:
            flat = flat.index_select(1, self.perm)
        out = int4_product(self, flat, self.group_scales())
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"kernel={self.kernel}")


def use_registers(model: nn.Module) -> int:
    """Let every Int4Linear of a draft `model` run int4_gemm's kernel on CUDA at the step widths
    where it was measured faster (widths.in_registers); a target's never do, so that its products
    stay those its exactness was checked with (a draft's may be anything). Returns how many."""
    linears = [module for module in model.modules() if isinstance(module, Int4Linear)]
    for linear in linears:
        linear.registers = True
    return len(linears)


def use_fused_only(model: nn.Module) -> int:
    """Make every Int4Linear in `model` run the fused kernel at every width (dropping any dense copy
    for wide inputs: quant/int4_dense.py), so that a row's output
    is the same whatever rows are beside it (so measured of the CPU kernel: tests/quant/test_int4.py; a
    chunked product's dense matmul blocks differently by width). Returns how many were set."""
    linears = [module for module in model.modules() if isinstance(module, Int4Linear)]
    for linear in linears:
        dtype = linear.compute_dtype
        if dtype not in FUSED_DTYPES[linear.kernel]:
            raise SpecchatError(f"{linear.kernel}'s fused int4 kernel takes no {dtype} inputs")
        linear.widths = WidthChoice(UNLIMITED, dtype)
        linear.dense = None
    return len(linears)


def int4_fits(in_features: int, out_features: int, group_size: int, kernel: torch.device) -> bool:
    """Whether `kernel`'s int4 path takes this shape: groups of 32-256 inputs, out_features a
    multiple of 16 and, on a CPU, of its layout's tile rows (chunked products read whole tiles;
    every real model's widths are multiples of 64)."""
    if group_size not in GROUP_SIZES or in_features % group_size or out_features % ROW_MULTIPLE:
        return False
    if kernel.type == "cuda":  # its inputs come in whole 32s already: a group of 32-256 divides them
        return True
    layout = layout_for(kernel, in_features)
    return layout is None or out_features % layout.rows == 0


def int4_tensors(weight: Int4Weight, bias: Tensor | None, dtype: torch.dtype, device: torch.device,
                 packed: Tensor | None = None) -> dict[str, Tensor]:
    """The buffers of an Int4Linear on `device` in `dtype` holding `weight` (what its state_dict,
    and so a layer file, holds); `packed`: its nibbles already packed for `device` (int4_cache)."""
    if not int4_fits(weight.in_features, weight.out_features, weight.group_size, device):
        raise SpecchatError(f"{device.type}'s int4 kernels cannot take a {weight.out_features} x {weight.in_features} "
                            f"weight in groups of {weight.group_size} (int4_fits)")
    tensors = {
        "packed": pack(weight.nibbles, device) if packed is None else packed.to(device),
        "scales_and_zeros": torch.stack([weight.scales, weight.zeros], dim=-1).to(device, dtype),
    }
    if weight.perm is not None:
        tensors["perm"] = weight.perm.to(device, torch.long)
    if bias is not None:
        tensors["bias"] = bias.to(device, dtype)
    return tensors


def int4_linear(weight: Int4Weight, bias: Tensor | None, dtype: torch.dtype, device: torch.device) -> Int4Linear:
    """An Int4Linear on `device` in `dtype` holding `weight`."""
    linear = Int4Linear(weight.in_features, weight.out_features, weight.group_size, bias is not None,
                        weight.perm is not None, dtype, device)
    linear.load_state_dict(int4_tensors(weight, bias, dtype, device))
    return linear.to(device)


def workspace_bytes(in_features: int, out_features: int, rows: int, dtype: torch.dtype, group_size: int,
                    kernel: str, act_order: bool) -> int:
    """The most memory an Int4Linear's forward allocates beyond its output, for `rows` input rows
    in `dtype`, whichever product the probes pick: with `act_order` the input permuted (`forward`'s
    index_select; without it the input goes in as it is), plus the chunked product's buffers or, on
    CUDA, the expansion's (the fused kernels allocate nothing; a CPU's dense copies are planned
    apart, and their product allocates only its output)."""
    permuted = rows * in_features * dtype.itemsize if act_order else 0
    products = [chunked_workspace(in_features, out_features, rows, dtype, product, group_size)
                for product in (torch.float32, dtype)]
    if kernel == "cuda":
        products.append(expanded_workspace(in_features, out_features, rows, dtype))
    return permuted + max(products)

