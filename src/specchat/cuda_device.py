"""Whether specchat computes on the GPU torch sees: one of compute capability 8.0 (Ampere) or newer.

Older cards (a Tesla T4 or V100, an RTX 20xx: 7.x) lack what the GPU path is built on: bfloat16
tensor cores (the default dtype), torch's fused int4 kernel (its m16n8k16 tiles need sm_80; every
4-bit target and the embedded pair's packed linears run it) and the Triton kernels' bfloat16 tile
products. On such a card the first 4-bit product would fail in the middle of loading; it is left
unused instead, said in one line, and the CPU runs everything as on a machine without a GPU.
"""

import torch

LEAST_CAPABILITY = (8, 0)


def cuda_usable() -> bool:
    """A GPU is there and new enough for specchat's kernels."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= LEAST_CAPABILITY


def unused_gpu() -> str | None:
    """One line on the GPU torch sees and specchat leaves unused; None where there is none."""
    if not torch.cuda.is_available() or cuda_usable():
        return None
    major, minor = torch.cuda.get_device_capability()
    least = ".".join(map(str, LEAST_CAPABILITY))
    return (f"the GPU here, {torch.cuda.get_device_name()} (compute capability {major}.{minor}), is older than "
            f"specchat's bfloat16 and 4-bit kernels need ({least}, Ampere): it is left unused and the CPU runs "
            "the models")
