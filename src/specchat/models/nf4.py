"""`--draft-quant nf4`: the draft in 4-bit NormalFloat through bitsandbytes, on CUDA only."""

import importlib.util

import torch

from specchat.errors import SpecchatError


def draft_quantization(kind: str, device: torch.device, dtype: torch.dtype) -> object | None:
    """The transformers quantization config for `kind`, or None for an unquantized draft."""
    if kind != "nf4":  # none, or quantized by specchat itself after loading (int8, auto)
        return None
    if device.type != "cuda":
        raise SpecchatError("--draft-quant nf4 needs a CUDA device (bitsandbytes 4-bit kernels); this machine has none")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SpecchatError("--draft-quant nf4 needs bitsandbytes: pip install 'specchat[nf4]'")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
