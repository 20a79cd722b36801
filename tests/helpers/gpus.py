"""A GPU torch sees, stood in for on this machine without one: its CUDA queries answered."""

import torch

RTX_4090 = (8, 9)  # compute capability: Ada, the card the SpecExec paper ran on
TESLA_T4 = (7, 5)  # Turing: older than specchat's kernels need (cuda_device.py)


def seen_gpu(monkeypatch, capability: tuple[int, int] | None = RTX_4090, name: str = "NVIDIA GeForce RTX 4090") -> None:
    """torch sees one GPU of `capability` named `name` (None: no GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
