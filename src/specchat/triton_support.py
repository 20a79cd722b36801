"""Whether Triton kernels can run in this process: the int4 expansion, the fp8 rows and the pull of
pinned host bytes (quant/, host_pull.py) each ask before launching theirs.

Triton is imported only when a kernel is launched (importing specchat does not need it)."""

import importlib.util
from functools import cache

import torch


@cache
def triton_installed() -> bool:
    """Whether triton can be imported: asked once a process (an fp8 draft's every product on CUDA
    asks whether its kernel serves), as an install does not change under a running process."""
    return importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether a kernel can run in this process: triton importable, and a CUDA device or Triton's
    interpreter (TRITON_INTERPRET=1) to run it on."""
    if not triton_installed():
        return False
    import triton

    return torch.cuda.is_available() or bool(triton.knobs.runtime.interpret)
