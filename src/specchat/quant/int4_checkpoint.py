"""Int4Weights as checkpoint tensors: three per linear, named after its module.

  <module>.int4_nibbles  uint8 [O, I/2], int4_pack's canonical order
  <module>.int4_scales   float32 [G, O]
  <module>.int4_zeros    float32 [G, O]
Device-independent: a layer is packed into its kernel's layout when it is loaded or written to a
layer file (quant/int4.py), never stored so here.
"""

from collections.abc import Callable, Iterable

from torch import Tensor

from specchat.quant.int4_weight import Int4Weight

INT4_FILE = "int4.safetensors"  # a checkpoint directory's Int4Weights, beside its dense tensors
INT4_SUFFIXES = (".int4_nibbles", ".int4_scales", ".int4_zeros")


def int4_entries(module: str, weight: Int4Weight) -> dict[str, Tensor]:
    """`weight`'s checkpoint tensors under `module`'s name."""
    nibbles, scales, zeros = (f"{module}{suffix}" for suffix in INT4_SUFFIXES)
    return {nibbles: weight.nibbles.contiguous(), scales: weight.scales.contiguous(), zeros: weight.zeros.contiguous()}


def int4_modules(names: Iterable[str]) -> list[str]:
    """The modules a checkpoint's tensor names hold Int4Weights for."""
    return [name.removesuffix(INT4_SUFFIXES[0]) for name in names if name.endswith(INT4_SUFFIXES[0])]


def read_int4(read: Callable[[str], Tensor], module: str) -> Int4Weight:
    """The Int4Weight of `module`, `read(name)` giving a checkpoint tensor."""
    nibbles, scales, zeros = (read(f"{module}{suffix}") for suffix in INT4_SUFFIXES)
    return Int4Weight(nibbles, scales.float(), zeros.float(), None)
